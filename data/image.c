// image.c: JPEG and PNG decoding (data/image.h) with stb_image, the one place its
// implementation is compiled.
//
// Only the decoders of the formats the datasets list (.jpg, .jpeg, .png) are compiled: a file
// with such a name that holds something else (a BMP, a PSD) is refused, and less decoder code
// ever sees a file. stb allocates zeroed memory (see STBI_MALLOC below), and before it decodes
// a file these checks refuse what it mishandles:
// - the size in the header, against IMAGE_MAX_PIXELS and, for a JPEG, against the file size;
// - PNG chunk lengths, against the file size: stb sizes its buffer for the compressed data
//   from the lengths chunks claim, before reading them, so a 91-byte file claiming an 800 MB
//   chunk made it allocate 800 MB (found by tests/fuzz/fuzz_decode.c): many such files in a
//   dataset could exhaust the memory of the loader threads; and an empty first IDAT chunk;
// - JPEG Huffman tables: stb_image 2.27 (Debian 12's libstb-dev) builds a table from 16 code
//   counts without checking that they add up to at most 256 symbols, and writes past the
//   table's arrays when they do not (found by tests/fuzz/fuzz_image.c). Every DHT segment is
//   walked here the way stb reads it, and a table of more than 256 codes is refused.
#include "data/image.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
// Zeroed allocations: stb 2.27 reads JPEG decoder state that a damaged file never set (the
// tables of a Huffman table id a scan names but no DHT defined), which made the pixels of such
// a file depend on whatever the heap held before: different from one decode to the next, and
// different across loader threads (found by tests/fuzz/fuzz_image.c, confirmed by
// MemorySanitizer). From zeroed memory the result is the same every time.
// Growth is zeroed too: stb 2.27's inflater takes the deflate distance codes 30 and 31, which
// the format forbids, as a distance of 0 and copies the output's own unwritten bytes forward;
// its buffer grows by realloc, so those bytes were whatever the heap held (found by
// tests/fuzz/fuzz_decode.c under MemorySanitizer). With the growth zeroed such a file decodes to
// the same pixels every time.
static void *realloc_zeroed(void *p, size_t old_size, size_t new_size) {
  char *q = realloc(p, new_size);
  if (q && new_size > old_size) memset(q + old_size, 0, new_size - old_size);
  return q;
}
#define STBI_MALLOC(size) calloc(1, (size))
#define STBI_REALLOC_SIZED(p, old_size, new_size) realloc_zeroed((p), (old_size), (new_size))
#define STBI_FREE(p) free(p)
#define STB_IMAGE_IMPLEMENTATION
#include "stb_image.h"

// The byte at pos, or 0 past the end, as stb's memory reader returns.
static unsigned byte_at(const uint8_t *p, size_t size, size_t pos) {
  return pos < size ? p[pos] : 0;
}

// One DHT segment's payload [pos, pos + len): tables of (class/id byte, 16 counts, symbols),
// read with stb's own bookkeeping. Only the symbol count matters to stb's safety.
static bool huffman_tables_ok(const uint8_t *p, size_t size, size_t pos, long len) {
  while (len > 0) {
    long codes = 0;
    for (int i = 0; i < 16; i++) codes += byte_at(p, size, pos + 1 + (size_t)i);
    if (codes > 256) return false;
    pos += 17 + (size_t)codes;
    len -= 17 + codes;
  }
  return true;
}

// Whether stb takes the file for a JPEG: SOI, with any fill bytes (0xFF) before it. Returns the
// position after SOI, or 0.
static size_t jpeg_start(const uint8_t *p, size_t size) {
  size_t pos = 0;
  while (pos < size && p[pos] == 0xFF) pos++;
  return pos == 0 || pos >= size || p[pos] != 0xD8 ? 0 : pos + 1;
}
static bool is_jpeg(const uint8_t *p, size_t size) {
  return jpeg_start(p, size) != 0;
}

// Walks a JPEG's marker segments and checks every DHT segment (true for a file that is not a
// JPEG). Like stb it steps over junk between segments (anything up to the next 0xFF), and over
// the entropy-coded data after each SOS the way stb's bit reader reads it: a 0xFF, any fill bytes
// (0xFF) after it, then 0x00 is a stuffed data byte and a restart marker lets the scan go on;
// anything else ends the scan as the next marker. (An earlier walk took "FF FF 00" for a marker,
// so stb read a DHT segment past it that the walk never saw: found by tests/fuzz/fuzz_image.c.)
// Where stb would give up, the walk goes on, so it sees every table stb could ever read.
static bool jpeg_tables_ok(const uint8_t *p, size_t size) {
  size_t pos = jpeg_start(p, size);
  if (pos == 0) return true;  // not a JPEG
  while (pos + 1 < size) {
    if (p[pos] != 0xFF) {
      pos++;
      continue;
    }
    while (pos < size && p[pos] == 0xFF) pos++;
    if (pos >= size) return true;
    unsigned marker = p[pos++];
    if (marker == 0xD9) return true;                                     // EOI
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no payload
    size_t len = (size_t)byte_at(p, size, pos) << 8 | byte_at(p, size, pos + 1);
    if (marker == 0xC4 && !huffman_tables_ok(p, size, pos + 2, (long)len - 2)) return false;
    pos += len < 2 ? 2 : len;
    if (marker != 0xDA) continue;
    // SOS: the scan's entropy-coded data, up to the 0xFF that starts the next marker.
    while (pos < size) {
      if (p[pos] != 0xFF) {
        pos++;
        continue;
      }
      size_t next = pos + 1;
      while (next < size && p[next] == 0xFF) next++;
      if (next >= size) return true;
      if (p[next] != 0x00 && !(p[next] >= 0xD0 && p[next] <= 0xD7)) break;
      pos = next + 1;
    }
  }
  return true;
}

static uint32_t read_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

// Deflate codes at most 258 bytes in a 1-bit literal/length code plus a 1-bit distance code
// (RFC 1951), so compressed data is never under 1/1032 of what it inflates to.
#define DEFLATE_MAX_RATIO 1032

// Whether a PNG's chunk list is one stb handles well (true also for a file that is not a PNG,
// and for one that ends early between chunks: stb refuses those itself); else why in why. Refused:
// - a chunk (length, type, data, CRC) that runs past the end of the file;
// - an empty IDAT chunk before any image data: stb then adds the offset 0 to its still NULL data
//   buffer, undefined behaviour (found by tests/fuzz/fuzz_image.c). No encoder writes one;
// - less compressed data than the pixels the header claims could inflate from: stb allocates
//   the whole image first, so 88 bytes claiming 4x16711684 RGBA pixels made it allocate 267 MB
//   before failing (found by tests/fuzz/fuzz_decode.c under MemorySanitizer, as a slow input).
static bool png_chunks_ok(const uint8_t *p, size_t size, char *why, size_t why_size) {
  static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size < 8 || memcmp(p, signature, 8) != 0) return true;
  size_t pos = 8;
  double pixel_bytes = 0, data_bytes = 0;  // as the header claims; in the IDAT chunks
  uint32_t w = 0, h = 0;
  while (size - pos >= 8) {
    uint32_t len = read_be32(p + pos);
    const uint8_t *type = p + pos + 4, *data = p + pos + 8;
    if (len > size - pos - 8) {
      snprintf(why, why_size, "corrupt PNG: a chunk runs past the end of the file");
      return false;
    }
    if (memcmp(type, "IEND", 4) == 0) break;
    if (memcmp(type, "IHDR", 4) == 0 && len >= 13) {
      static const int channels[7] = {1, 0, 3, 1, 2, 0, 4};  // by colour type; 0: invalid
      w = read_be32(data), h = read_be32(data + 4);
      int depth = data[8], color = data[9] < 7 ? channels[data[9]] : 0;
      pixel_bytes = (double)w * h * depth * color / 8;
    }
    if (memcmp(type, "IDAT", 4) == 0) {
      if (len == 0 && data_bytes == 0) {
        snprintf(why, why_size, "corrupt PNG: an empty IDAT chunk before the image data");
        return false;
      }
      data_bytes += len;
    }
    pos += 8 + (size_t)len;
    pos += size - pos < 4 ? size - pos : 4;  // the CRC
  }
  if (data_bytes * DEFLATE_MAX_RATIO < pixel_bytes) {
    snprintf(why, why_size,
             "truncated PNG: a %ux%u image needs at least %.0f bytes of compressed data, the "
             "file has %.0f",
             w, h, ceil(pixel_bytes / DEFLATE_MAX_RATIO), data_bytes);
    return false;
  }
  return true;
}

int image_check(const uint8_t *file, size_t size, int *h, int *w, bool *jpeg, char *why,
                size_t why_size) {
  int file_chans = 0;
  *jpeg = false;
  if (size > INT_MAX) {
    snprintf(why, why_size, "the file is %zu bytes, over the decoder's 2 GB limit", size);
    return -1;
  }
  // Before stbi_info, which reads the Huffman tables in front of the frame header too.
  if (!jpeg_tables_ok(file, size)) {
    snprintf(why, why_size, "corrupt JPEG: a Huffman table has more than 256 codes");
    return -1;
  }
  if (!png_chunks_ok(file, size, why, why_size)) return -1;
  if (!stbi_info_from_memory(file, (int)size, w, h, &file_chans)) {
    const char *reason = stbi_failure_reason();
    snprintf(why, why_size, "%s", reason ? reason : "not a JPEG or PNG image");
    return -1;
  }
  if ((int64_t)*w * *h > IMAGE_MAX_PIXELS) {
    snprintf(why, why_size, "the image is %dx%d, over the limit of %lld pixels", *w, *h,
             (long long)IMAGE_MAX_PIXELS);
    return -1;
  }
  // Every 8x8 block of a JPEG codes at least its DC term, a Huffman code of at least one bit,
  // so a valid file holds at least w * h / 512 bytes. stb decodes a shorter (truncated) one
  // anyway, on zeros past the end: garbage pixels, and seconds of work for a few hundred bytes
  // that claim 60 megapixels (found by tests/fuzz/fuzz_decode.c; again behind a fill byte
  // before SOI, which the first check missed).
  if (is_jpeg(file, size) && (int64_t)size * 512 < (int64_t)*w * *h) {
    snprintf(why, why_size,
             "truncated JPEG: a %dx%d image needs at least %lld bytes, the file has %zu", *w, *h,
             (long long)((int64_t)*w * *h / 512), size);
    return -1;
  }
  *jpeg = is_jpeg(file, size);
  return 0;
}

uint8_t *image_decode(const uint8_t *file, size_t size, int chans, int *h, int *w, char *why,
                      size_t why_size) {
  bool jpeg;
  if (image_check(file, size, h, w, &jpeg, why, why_size) != 0) return NULL;
  int file_chans = 0;
  uint8_t *pixels = stbi_load_from_memory(file, (int)size, w, h, &file_chans, chans);
  if (!pixels) {
    const char *reason = stbi_failure_reason();
    snprintf(why, why_size, "%s", reason ? reason : "unknown reason");
  }
  return pixels;
}

void image_free(uint8_t *pixels) {
  stbi_image_free(pixels);
}
