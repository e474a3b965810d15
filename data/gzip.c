// gzip.c: gzip's container (RFC 1952: header fields, CRC-32, trailer) around stb_image's
// inflater (see gzip.h).
#include "data/gzip.h"

#include <limits.h>
#include <stdlib.h>

#include "stb_image.h"  // its zlib decoder; data/image.c compiles the implementation

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320) as gzip's trailer uses it. The table is
// built per call: 256 entries cost nothing next to the inflate, and no global state is needed.
static uint32_t crc32_bytes(const uint8_t *data, size_t n) {
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

static uint32_t read_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

bool gzip_detect(const uint8_t *buf, size_t size) {
  return size >= 2 && buf[0] == 0x1F && buf[1] == 0x8B;
}

uint8_t *gzip_inflate(const uint8_t *buf, size_t size, const char *path, size_t *out_size,
                      Error *err) {
  enum { FTEXT = 1, FHCRC = 2, FEXTRA = 4, FNAME = 8, FCOMMENT = 16 };
  const char *hint = "HINT: the file is damaged or incomplete; download or reinstall it";
  if (size < 18) {
    error_set(err, "'%s': truncated gzip file (%zu bytes)\n%s", path, size, hint);
    return NULL;
  }
  if (buf[2] != 8 || (buf[3] & 0xE0)) {
    error_set(err, "'%s': unsupported gzip header (method %d, flags 0x%02x; only deflate)", path,
              buf[2], buf[3]);
    return NULL;
  }
  uint8_t flags = buf[3];
  size_t pos = 10;  // magic, method, flags, mtime, xfl, os
  size_t body_end = size - 8;
  if (flags & FEXTRA) {
    if (pos + 2 > body_end) goto truncated;
    pos += 2 + (size_t)(buf[pos] | buf[pos + 1] << 8);
  }
  for (int field = FNAME; field <= FCOMMENT; field <<= 1) {
    if (!(flags & field)) continue;
    while (pos < body_end && buf[pos] != 0) pos++;
    pos++;  // the terminating zero
  }
  if (flags & FHCRC) {
    if (pos + 2 > body_end) goto truncated;
    uint32_t want = (uint32_t)(buf[pos] | buf[pos + 1] << 8);
    if ((crc32_bytes(buf, pos) & 0xFFFF) != want) {
      error_set(err, "'%s': gzip header CRC mismatch\n%s", path, hint);
      return NULL;
    }
    pos += 2;
  }
  if (pos > body_end) goto truncated;
  if (size - pos > INT_MAX) {
    error_set(err, "'%s': gzip file too large (%zu bytes) for the built-in inflater", path, size);
    return NULL;
  }
  // The input runs to the end of the file, trailer included: stb_image 2.27's inflater fails
  // ("bad huffman code") when a code's last bits sit in the final 2 bytes of its input, and the
  // 8 trailer bytes are lookahead it reads but never decodes (it stops at the final block).
  int out_len = 0;
  uint8_t *out = (uint8_t *)stbi_zlib_decode_noheader_malloc((const char *)buf + pos,
                                                             (int)(size - pos), &out_len);
  if (!out) {
    const char *why = stbi_failure_reason();
    error_set(err, "'%s': corrupt gzip data (inflate failed: %s)\n%s", path, why ? why : "unknown",
              hint);
    return NULL;
  }
  uint32_t want_crc = read_le32(buf + body_end), want_size = read_le32(buf + body_end + 4);
  if ((uint32_t)out_len != want_size) {
    error_set(err,
              "'%s': gzip size mismatch: inflated %d bytes, trailer says %u (a damaged file, or "
              "a multi-member gzip, which is not supported)\n%s",
              path, out_len, want_size, hint);
    free(out);
    return NULL;
  }
  uint32_t got_crc = crc32_bytes(out, (size_t)out_len);
  if (got_crc != want_crc) {
    error_set(err, "'%s': gzip CRC mismatch (data 0x%08x, trailer 0x%08x)\n%s", path, got_crc,
              want_crc, hint);
    free(out);
    return NULL;
  }
  *out_size = (size_t)out_len;
  return out;
truncated:
  error_set(err, "'%s': truncated gzip header\n%s", path, hint);
  return NULL;
}
