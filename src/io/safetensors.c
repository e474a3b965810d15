// safetensors.c: reads, validates and atomically writes safetensors files (src/io/safetensors.h),
// and converts fp32 to and from bf16 and fp16.
//
// The header parser is not a general JSON parser: it accepts exactly what the format's header
// holds (objects, strings, non-negative integers, arrays of them) and refuses everything else
// with the byte offset, so a hostile file cannot reach code that was never meant for it.
#define _XOPEN_SOURCE 700     // fstat, fileno: POSIX, not C11
#define _FILE_OFFSET_BITS 64  // st_size of files over 2 GiB on 32-bit systems too

#include "src/io/safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// A header larger than this is refused before any allocation: real headers are kilobytes, and
// the limit keeps a corrupted length from asking for gigabytes.
#define HEADER_MAX_BYTES ((uint64_t)100 * 1000 * 1000)
#define CHECKSUM_KEY "swin.checksum"
// The reader places the data section at this alignment, so a tensor whose offset is a multiple
// of its element size can be read in place with aligned (vector) loads.
#define DATA_ALIGN 64
// Big reads and writes go in pieces: one stdio call per GiB keeps every count far from the
// limits of the underlying read/write calls.
#define IO_CHUNK ((size_t)1 << 30)

static const char *const header_hint =
    "HINT: the file is damaged or not a safetensors file; re-export it or use another copy";

// ----------------------------------------------------------------------------------------------
// Small helpers

static uint64_t read_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void write_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static char *copy_string(const char *s) {
  size_t n = strlen(s);
  char *c = malloc_check(n + 1);
  memcpy(c, s, n + 1);
  return c;
}

// Grows an array of `elem`-byte items so that one more fits; aborts on out-of-memory like
// malloc_check.
static void *grow(void *items, int count, int *capacity, size_t elem) {
  if (count < *capacity) return items;
  int new_capacity = *capacity ? 2 * *capacity : 16;
  void *bigger = malloc_check((size_t)new_capacity * elem);
  if (count) memcpy(bigger, items, (size_t)count * elem);
  free(items);
  *capacity = new_capacity;
  return bigger;
}

// Byte offset of the first malformed UTF-8 sequence in s (n), or n when it is all valid.
// Overlong forms, surrogates and code points past U+10FFFF are malformed, as in RFC 3629.
static size_t utf8_invalid_at(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    int len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80)
      len = 1;
    else if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else
      return i;
    if (len > 1) {
      if (i + (size_t)len > n || s[i + 1] < lo || s[i + 1] > hi) return i;
      for (int k = 2; k < len; k++)
        if ((s[i + k] & 0xC0) != 0x80) return i;
    }
    i += (size_t)len;
  }
  return n;
}

// The checksum: FNV-1a, 64 bit, taken over 8-byte little-endian words (a byte at a time only for
// a final partial word), so a checkpoint of hundreds of MB hashes at memory speed. Stable, and
// good at catching flipped or lost bytes (it is not meant to stop an adversary). The Hasher
// buffers partial words, so hashing a stream in pieces equals hashing it whole.
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

typedef struct {
  uint64_t h;
  unsigned char pending[8];
  int npending;
} Hasher;

static Hasher hasher_start(void) {
  return (Hasher){.h = FNV_OFFSET};
}

static void hasher_update(Hasher *x, const void *data, size_t n) {
  const unsigned char *p = data;
  while (n && x->npending) {  // complete a buffered word first
    x->pending[x->npending++] = *p++, n--;
    if (x->npending == 8) {
      uint64_t w;
      memcpy(&w, x->pending, 8);
      x->h = (x->h ^ w) * FNV_PRIME;
      x->npending = 0;
    }
  }
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    memcpy(&w, p, 8);  // little-endian hosts only, like the format's header length
    x->h = (x->h ^ w) * FNV_PRIME;
  }
  while (n) x->pending[x->npending++] = *p++, n--;
}

static uint64_t hasher_finish(Hasher *x) {
  for (int i = 0; i < x->npending; i++) x->h = (x->h ^ x->pending[i]) * FNV_PRIME;
  x->npending = 0;
  return x->h;
}

// The checksum covers, in order: every metadata key and value but its own, each followed by a 0
// byte (so "ab"+"c" and "a"+"bc" differ); every tensor entry in header order (name, 0, dtype
// name, 0, ndim, each dimension and both offsets as 8-byte integers); then the data section.
static void hash_header(Hasher *x, const SafeTensorMeta *meta, int meta_count,
                        const SafeTensorEntry *entries, int count) {
  static const unsigned char zero = 0;
  for (int i = 0; i < meta_count; i++) {
    if (strcmp(meta[i].key, CHECKSUM_KEY) == 0) continue;
    hasher_update(x, meta[i].key, strlen(meta[i].key));
    hasher_update(x, &zero, 1);
    hasher_update(x, meta[i].value, strlen(meta[i].value));
    hasher_update(x, &zero, 1);
  }
  for (int i = 0; i < count; i++) {
    const SafeTensorEntry *e = &entries[i];
    const char *dtype = dtype_name(e->dtype);
    uint64_t ndim = (uint64_t)e->ndim;
    hasher_update(x, e->name, strlen(e->name));
    hasher_update(x, &zero, 1);
    hasher_update(x, dtype, strlen(dtype));
    hasher_update(x, &zero, 1);
    hasher_update(x, &ndim, 8);
    for (int d = 0; d < e->ndim; d++) hasher_update(x, &e->shape[d], 8);
    hasher_update(x, &e->begin, 8);
    hasher_update(x, &e->end, 8);
  }
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Returns a name that occurs twice in names (count), or NULL. Sorting keeps this O(n log n)
// for headers with very many entries.
static const char *find_duplicate(const char **names, int count) {
  if (count < 2) return NULL;
  const char **sorted = malloc_check((size_t)count * sizeof *sorted);
  memcpy(sorted, names, (size_t)count * sizeof *sorted);
  qsort(sorted, (size_t)count, sizeof *sorted, compare_strings);
  const char *dup = NULL;
  for (int i = 1; i < count && !dup; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0) dup = sorted[i];
  free(sorted);
  return dup;
}

// numel * element size, or -1 when it does not fit in 64 bits.
static int tensor_nbytes(DType dtype, int ndim, const int64_t *shape, uint64_t *nbytes) {
  uint64_t n = dtype_size(dtype);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    uint64_t d = (uint64_t)shape[i];
    if (d != 0 && n > UINT64_MAX / d) return -1;
    n *= d;
  }
  *nbytes = n;
  return 0;
}

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape) {
  size_t used = (size_t)snprintf(buf, size, "[");
  for (int i = 0; i < ndim && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (used < size) snprintf(buf + used, size - used, "]");
}

// ----------------------------------------------------------------------------------------------
// Header JSON parser

typedef struct {
  const char *s;  // the header JSON (n bytes, not NUL-terminated)
  size_t n, pos;
  const char *origin;  // file path or caller's name for the bytes, for messages
  Error *err;
} JsonParser;

static int json_error(JsonParser *p, const char *what) {
  return error_set(p->err,
                   "safetensors '%s': header JSON syntax error at header byte %zu "
                   "(file offset %zu): %s\n%s",
                   p->origin, p->pos, p->pos + 8, what, header_hint);
}

// Errors about a well-formed header that describes something wrong.
static int header_error(const JsonParser *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int header_error(const JsonParser *p, const char *fmt, ...) {
  char what[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return error_set(p->err, "safetensors '%s': %s", p->origin, what);
}

static void json_skip_space(JsonParser *p) {
  while (p->pos < p->n && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' ||
                           p->s[p->pos] == '\r'))
    p->pos++;
}

// Skips whitespace and consumes c if it is next; returns whether it was.
static bool json_accept(JsonParser *p, char c) {
  json_skip_space(p);
  if (p->pos < p->n && p->s[p->pos] == c) {
    p->pos++;
    return true;
  }
  return false;
}

static int json_expect(JsonParser *p, char c, const char *what) {
  return json_accept(p, c) ? 0 : json_error(p, what);
}

static int hex4(const char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    unsigned d;
    if (c >= '0' && c <= '9')
      d = (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = (unsigned)(c - 'A' + 10);
    else
      return -1;
    v = v * 16 + d;
  }
  *out = v;
  return 0;
}

static size_t utf8_encode(unsigned cp, char *out) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

// Reads a \uXXXX escape (p->pos at the backslash) and, for a high surrogate, the low one that
// must follow; writes the code point.
static int json_unicode_escape(JsonParser *p, size_t end, unsigned *cp) {
  unsigned hi, lo;
  if (p->pos + 6 > end || hex4(p->s + p->pos + 2, &hi) != 0)
    return json_error(p, "\\u must be followed by 4 hex digits");
  if (hi >= 0xDC00 && hi <= 0xDFFF) return json_error(p, "unpaired low surrogate in a \\u escape");
  p->pos += 6;
  if (hi < 0xD800 || hi > 0xDBFF) {
    *cp = hi;
    return 0;
  }
  if (p->pos + 6 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
      hex4(p->s + p->pos + 2, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
    return json_error(p, "high surrogate not followed by a \\u low surrogate");
  p->pos += 6;
  *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
  return 0;
}

// Parses a string into a new NUL-terminated UTF-8 buffer. NUL itself (\u0000) is refused:
// names and metadata are C strings here, and a NUL would silently cut them.
static int json_string(JsonParser *p, char **out) {
  *out = NULL;
  json_skip_space(p);
  if (p->pos >= p->n || p->s[p->pos] != '"') return json_error(p, "expected a string");
  size_t start = p->pos + 1, end = start;
  // Find the closing quote first so the buffer is sized by this string, not by the header.
  while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->n) return json_error(p, "unterminated string");
  // Every escape decodes to no more bytes than it spans, so end - start bytes suffice.
  char *buf = malloc_check(end - start + 1);
  size_t len = 0;
  p->pos = start;
  while (p->pos < end) {
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c < 0x20) {
      free(buf);
      return json_error(p, "control character in a string (it must be escaped)");
    }
    if (c != '\\') {
      buf[len++] = (char)c;
      p->pos++;
      continue;
    }
    char e = p->s[p->pos + 1];
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e != 0 && simple) {
      static const char decoded[] = "\"\\/\b\f\n\r\t";
      buf[len++] = decoded[simple - "\"\\/bfnrt"];
      p->pos += 2;
    } else if (e == 'u') {
      unsigned cp = 0;
      if (json_unicode_escape(p, end, &cp) != 0) {
        free(buf);
        return -1;
      }
      if (cp == 0) {
        p->pos -= 6;
        free(buf);
        return json_error(p, "\\u0000 (NUL) is not allowed in names or metadata");
      }
      len += utf8_encode(cp, buf + len);
    } else {
      free(buf);
      return json_error(p,
                        "invalid escape in a string (allowed: \\\" \\\\ \\/ \\b \\f \\n \\r "
                        "\\t \\uXXXX)");
    }
  }
  buf[len] = 0;
  p->pos = end + 1;
  *out = buf;
  return 0;
}

static int json_uint(JsonParser *p, uint64_t *out) {
  json_skip_space(p);
  if (p->pos < p->n && p->s[p->pos] == '-')
    return json_error(p, "negative numbers are not allowed here");
  if (p->pos >= p->n || p->s[p->pos] < '0' || p->s[p->pos] > '9')
    return json_error(p, "expected a non-negative integer");
  if (p->s[p->pos] == '0' && p->pos + 1 < p->n && p->s[p->pos + 1] >= '0' &&
      p->s[p->pos + 1] <= '9')
    return json_error(p, "leading zeros are not allowed in JSON numbers");
  uint64_t v = 0;
  while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
    uint64_t d = (uint64_t)(p->s[p->pos] - '0');
    if (v > (UINT64_MAX - d) / 10) return json_error(p, "integer too large for 64 bits");
    v = v * 10 + d;
    p->pos++;
  }
  if (p->pos < p->n && (p->s[p->pos] == '.' || p->s[p->pos] == 'e' || p->s[p->pos] == 'E'))
    return json_error(p, "expected an integer, found a fraction or exponent");
  *out = v;
  return 0;
}

// Parses [i, j, ...] into vals (room for max). More than max values fails with too_many.
static int json_uint_array(JsonParser *p, uint64_t *vals, int max, int *count,
                           const char *too_many) {
  *count = 0;
  if (json_expect(p, '[', "expected '[' (an array of integers)") != 0) return -1;
  if (json_accept(p, ']')) return 0;
  do {
    if (*count == max) return header_error(p, "%s\n%s", too_many, header_hint);
    if (json_uint(p, &vals[(*count)++]) != 0) return -1;
  } while (json_accept(p, ','));
  return json_expect(p, ']', "expected ',' or ']' in an array of integers");
}

// {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} for the entry e->name.
static int parse_entry(JsonParser *p, SafeTensorEntry *e) {
  bool have_dtype = false, have_shape = false, have_offsets = false;
  char too_many[512];
  if (json_expect(p, '{', "expected '{' (a tensor entry)") != 0) return -1;
  if (!json_accept(p, '}')) {
    do {
      char *key;
      size_t key_pos = p->pos;
      if (json_string(p, &key) != 0) return -1;
      int rc = json_expect(p, ':', "expected ':' after a field name");
      if (rc == 0 && strcmp(key, "dtype") == 0 && !have_dtype) {
        char *name;
        rc = json_string(p, &name);
        if (rc == 0 && dtype_from_name(name, &e->dtype) != 0)
          rc = header_error(p,
                            "tensor '%s': unsupported dtype \"%s\"\nHINT: swin.c reads F32, "
                            "BF16, F16, U8 and I32; convert the tensor to one of them",
                            e->name, name);
        free(name);
        have_dtype = true;
      } else if (rc == 0 && strcmp(key, "shape") == 0 && !have_shape) {
        uint64_t dims[TENSOR_MAX_DIMS];
        snprintf(too_many, sizeof too_many, "tensor '%s': shape has more than %d dimensions",
                 e->name, TENSOR_MAX_DIMS);
        rc = json_uint_array(p, dims, TENSOR_MAX_DIMS, &e->ndim, too_many);
        for (int i = 0; rc == 0 && i < e->ndim; i++) {
          if (dims[i] > (uint64_t)INT64_MAX)
            rc = header_error(p, "tensor '%s': dimension %d is too large (%llu)", e->name, i,
                              (unsigned long long)dims[i]);
          e->shape[i] = (int64_t)dims[i];
        }
        have_shape = true;
      } else if (rc == 0 && strcmp(key, "data_offsets") == 0 && !have_offsets) {
        uint64_t offsets[2] = {0, 0};
        int count;
        snprintf(too_many, sizeof too_many,
                 "tensor '%s': data_offsets must be [begin, end], found more values", e->name);
        rc = json_uint_array(p, offsets, 2, &count, too_many);
        if (rc == 0 && count != 2)
          rc = header_error(p,
                            "tensor '%s': data_offsets must be [begin, end], found %d value%s"
                            "\n%s",
                            e->name, count, count == 1 ? "" : "s", header_hint);
        e->begin = offsets[0];
        e->end = offsets[1];
        have_offsets = true;
      } else if (rc == 0) {
        bool repeated = strcmp(key, "dtype") == 0 || strcmp(key, "shape") == 0 ||
                        strcmp(key, "data_offsets") == 0;
        rc = header_error(p,
                          "tensor '%s': %s field \"%s\" at header byte %zu (an entry holds "
                          "dtype, shape and data_offsets)\n%s",
                          e->name, repeated ? "repeated" : "unknown", key, key_pos, header_hint);
      }
      free(key);
      if (rc != 0) return -1;
    } while (json_accept(p, ','));
    if (json_expect(p, '}', "expected ',' or '}' in a tensor entry") != 0) return -1;
  }
  const char *missing = !have_dtype     ? "dtype"
                        : !have_shape   ? "shape"
                        : !have_offsets ? "data_offsets"
                                        : NULL;
  if (missing)
    return header_error(p, "tensor '%s': missing \"%s\"\n%s", e->name, missing, header_hint);
  return 0;
}

// {"key": "value", ...}: strings only, as the format defines metadata.
static int parse_metadata(JsonParser *p, SafeTensors *st, int *capacity) {
  if (json_expect(p, '{', "expected '{' (the __metadata__ object of strings)") != 0) return -1;
  if (json_accept(p, '}')) return 0;
  do {
    char *key, *value;
    if (json_string(p, &key) != 0) return -1;
    if (json_expect(p, ':', "expected ':' after a metadata key") != 0 ||
        json_string(p, &value) != 0) {
      free(key);
      return -1;
    }
    st->meta = grow(st->meta, st->meta_count, capacity, sizeof *st->meta);
    st->meta[st->meta_count++] = (SafeTensorMeta){.key = key, .value = value};
  } while (json_accept(p, ','));
  return json_expect(p, '}', "expected ',' or '}' in __metadata__");
}

static int parse_header(JsonParser *p, SafeTensors *st) {
  int entry_capacity = 0, meta_capacity = 0;
  bool have_meta = false;
  if (json_expect(p, '{', "expected '{' (the header is a JSON object)") != 0) return -1;
  if (!json_accept(p, '}')) {
    do {
      char *name;
      size_t name_pos = p->pos;
      if (json_string(p, &name) != 0) return -1;
      int rc = json_expect(p, ':', "expected ':' after a tensor name");
      if (rc == 0 && strcmp(name, "__metadata__") == 0) {
        if (have_meta)
          rc = header_error(p, "__metadata__ appears twice\n%s", header_hint);
        else
          rc = parse_metadata(p, st, &meta_capacity);
        have_meta = true;
      } else if (rc == 0 && strlen(name) >= sizeof st->entries[0].name) {
        rc = header_error(p,
                          "tensor name at header byte %zu is %zu bytes, longer than the "
                          "%zu that swin.c supports: '%.64s...'",
                          name_pos, strlen(name), sizeof st->entries[0].name - 1, name);
      } else if (rc == 0) {
        st->entries = grow(st->entries, st->count, &entry_capacity, sizeof *st->entries);
        SafeTensorEntry *e = &st->entries[st->count++];
        *e = (SafeTensorEntry){0};
        memcpy(e->name, name, strlen(name) + 1);
        rc = parse_entry(p, e);
      }
      free(name);
      if (rc != 0) return -1;
    } while (json_accept(p, ','));
    if (json_expect(p, '}', "expected ',' or '}' after a header entry") != 0) return -1;
  }
  json_skip_space(p);
  if (p->pos != p->n) return json_error(p, "unexpected data after the header object");
  return 0;
}

// ----------------------------------------------------------------------------------------------
// Validation of the parsed header against the data section

static int compare_ranges(const void *a, const void *b) {
  const SafeTensorEntry *x = *(const SafeTensorEntry *const *)a;
  const SafeTensorEntry *y = *(const SafeTensorEntry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int check_entries(const JsonParser *p, const SafeTensors *st) {
  const char **names = malloc_check((size_t)(st->count + 1) * sizeof *names);
  for (int i = 0; i < st->count; i++) names[i] = st->entries[i].name;
  const char *dup = find_duplicate(names, st->count);
  int rc =
      dup ? header_error(p, "tensor '%s' appears twice in the header\n%s", dup, header_hint) : 0;
  free(names);
  if (rc != 0) return -1;

  const char **keys = malloc_check((size_t)(st->meta_count + 1) * sizeof *keys);
  for (int i = 0; i < st->meta_count; i++) keys[i] = st->meta[i].key;
  dup = find_duplicate(keys, st->meta_count);
  free(keys);
  if (dup)
    return header_error(p, "metadata key '%s' appears twice in __metadata__\n%s", dup, header_hint);

  for (int i = 0; i < st->count; i++) {
    const SafeTensorEntry *e = &st->entries[i];
    char shape[160];
    format_shape(shape, sizeof shape, e->ndim, e->shape);
    uint64_t nbytes;
    if (e->begin > e->end)
      return header_error(p, "tensor '%s': data_offsets [%llu, %llu] begin after end\n%s", e->name,
                          (unsigned long long)e->begin, (unsigned long long)e->end, header_hint);
    if (e->end > st->data_size)
      return header_error(p,
                          "tensor '%s': data_offsets [%llu, %llu] go beyond the data section "
                          "(%zu bytes)\nHINT: the file is truncated or damaged; copy it again",
                          e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                          st->data_size);
    if (tensor_nbytes(e->dtype, e->ndim, e->shape, &nbytes) != 0)
      return header_error(p, "tensor '%s': shape %s is too large\n%s", e->name, shape, header_hint);
    if (nbytes != e->end - e->begin)
      return header_error(p,
                          "tensor '%s': shape %s %s needs %llu bytes but data_offsets "
                          "[%llu, %llu] hold %llu\n%s",
                          e->name, shape, dtype_name(e->dtype), (unsigned long long)nbytes,
                          (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)(e->end - e->begin), header_hint);
  }

  // The format requires the tensors to tile the data section exactly: no overlap, no gap.
  const SafeTensorEntry **order = malloc_check((size_t)(st->count + 1) * sizeof *order);
  for (int i = 0; i < st->count; i++) order[i] = &st->entries[i];
  qsort(order, (size_t)st->count, sizeof *order, compare_ranges);
  uint64_t covered = 0;  // bytes [0, covered) belong to the tensors seen so far
  for (int i = 0; i < st->count && rc == 0; i++) {
    const SafeTensorEntry *e = order[i];
    if (e->begin < covered)
      rc = header_error(p,
                        "tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' "
                        "(which ends at %llu)\n%s",
                        e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        order[i - 1]->name, (unsigned long long)covered, header_hint);
    else if (e->begin > covered)
      rc = header_error(p,
                        "gap in the data section: bytes [%llu, %llu) before tensor '%s' "
                        "belong to no tensor\n%s",
                        (unsigned long long)covered, (unsigned long long)e->begin, e->name,
                        header_hint);
    covered = e->end;
  }
  free(order);
  if (rc == 0 && covered != st->data_size)
    rc = header_error(p,
                      "gap in the data section: its last %llu bytes (from offset %llu) are "
                      "not covered by any tensor\n%s",
                      (unsigned long long)(st->data_size - covered), (unsigned long long)covered,
                      header_hint);
  return rc;
}

static int check_checksum(const JsonParser *p, SafeTensors *st) {
  const char *stored = safetensors_meta_get(st, CHECKSUM_KEY);
  if (!stored) return 0;
  if (strlen(stored) != 16 || strspn(stored, "0123456789abcdef") != 16)
    return header_error(p, "metadata %s is \"%s\", not 16 lowercase hex digits\n%s", CHECKSUM_KEY,
                        stored, header_hint);
  Hasher x = hasher_start();
  hash_header(&x, st->meta, st->meta_count, st->entries, st->count);
  hasher_update(&x, st->data, st->data_size);
  uint64_t h = hasher_finish(&x);
  char computed[17];
  snprintf(computed, sizeof computed, "%016llx", (unsigned long long)h);
  if (strcmp(computed, stored) != 0)
    return header_error(p,
                        "checksum mismatch: the file is corrupted (stored %s, computed %s)\n"
                        "HINT: use an older checkpoint",
                        stored, computed);
  st->has_checksum = true;
  return 0;
}

// ----------------------------------------------------------------------------------------------
// Reader

// Where the file starts in its buffer so that the data section, at 8 + header length, lands on
// a DATA_ALIGN boundary. safetensors_free recomputes it from the same 8 bytes.
static size_t file_offset_in_buffer(const unsigned char *first8, size_t size) {
  if (size < 8) return 0;
  return (size_t)((DATA_ALIGN - (8 + read_le64(first8) % DATA_ALIGN) % DATA_ALIGN) % DATA_ALIGN);
}

// Validates the file held in buffer (offset bytes in), taking ownership of buffer.
static int parse_owned(SafeTensors *st, unsigned char *buffer, size_t offset, size_t size,
                       const char *origin, Error *err) {
  *st = (SafeTensors){0};
  unsigned char *file = buffer + offset;
  JsonParser p = {.origin = origin, .err = err};
  if (size < 8) {
    free(buffer);
    return header_error(&p, "the file is %zu bytes, too short for the 8-byte header length\n%s",
                        size, header_hint);
  }
  uint64_t header_len = read_le64(file);
  int rc = 0;
  if (header_len > HEADER_MAX_BYTES)
    rc = header_error(&p, "header length %llu bytes is over the %llu MB limit\n%s",
                      (unsigned long long)header_len,
                      (unsigned long long)(HEADER_MAX_BYTES / 1000000), header_hint);
  else if (header_len > size - 8)
    rc = header_error(&p,
                      "header length %llu bytes goes beyond the end of the file (%zu bytes)"
                      "\nHINT: the file is truncated; copy it again",
                      (unsigned long long)header_len, size);
  if (rc != 0) {
    free(buffer);
    return rc;
  }
  size_t bad = utf8_invalid_at(file + 8, (size_t)header_len);
  if (bad != header_len) {
    free(buffer);
    return header_error(&p, "header is not valid UTF-8 at header byte %zu\n%s", bad, header_hint);
  }
  snprintf(st->path, sizeof st->path, "%s", origin);
  st->file = file;
  st->file_size = size;
  st->data = file + 8 + header_len;
  st->data_size = size - 8 - (size_t)header_len;
  p.s = (const char *)file + 8;
  p.n = (size_t)header_len;
  if (parse_header(&p, st) != 0 || check_entries(&p, st) != 0 || check_checksum(&p, st) != 0) {
    safetensors_free(st);
    return -1;
  }
  return 0;
}

int safetensors_parse(SafeTensors *st, const unsigned char *bytes, size_t size, const char *origin,
                      Error *err) {
  size_t offset = file_offset_in_buffer(bytes, size);
  unsigned char *buffer = aligned_alloc_check(offset + size);
  if (size) memcpy(buffer + offset, bytes, size);
  return parse_owned(st, buffer, offset, size, origin, err);
}

static int read_fully(FILE *f, unsigned char *dst, size_t n) {
  while (n > 0) {
    size_t want = n < IO_CHUNK ? n : IO_CHUNK;
    size_t got = fread(dst, 1, want, f);
    if (got == 0) return -1;
    dst += got;
    n -= got;
  }
  return 0;
}

int safetensors_read(SafeTensors *st, const char *path, Error *err) {
  *st = (SafeTensors){0};
  FILE *f = fopen(path, "rb");
  if (!f)
    return error_set(err, "cannot open safetensors file '%s': %s%s", path, strerror(errno),
                     errno == ENOENT ? "\nHINT: check the path (it is relative to the current "
                                       "directory unless it starts with /)"
                                     : "");
  struct stat info;
  if (fstat(fileno(f), &info) != 0) {
    int e = errno;
    fclose(f);
    return error_set(err, "cannot read safetensors file '%s': %s", path, strerror(e));
  }
  if (!S_ISREG(info.st_mode)) {
    fclose(f);
    return error_set(err, "cannot read safetensors file '%s': not a regular file", path);
  }
  size_t size = (size_t)info.st_size;
  // The first 8 bytes give the header length, which decides where the file goes in its buffer.
  unsigned char first8[8] = {0};
  size_t head = size < 8 ? size : 8;
  if (read_fully(f, first8, head) != 0) goto read_error;
  size_t offset = file_offset_in_buffer(first8, size);
  unsigned char *buffer = aligned_alloc_check(offset + size);
  memcpy(buffer + offset, first8, head);
  if (read_fully(f, buffer + offset + head, size - head) != 0) {
    free(buffer);
    goto read_error;
  }
  fclose(f);
  return parse_owned(st, buffer, offset, size, path, err);
read_error:;
  int e = ferror(f) ? errno : 0;
  fclose(f);
  return error_set(err, "cannot read safetensors file '%s' (%zu bytes): %s", path, size,
                   e ? strerror(e) : "the file got shorter while being read");
}

void safetensors_free(SafeTensors *st) {
  if (st->file) free(st->file - file_offset_in_buffer(st->file, st->file_size));
  for (int i = 0; i < st->meta_count; i++) {
    free(st->meta[i].key);
    free(st->meta[i].value);
  }
  free(st->meta);
  free(st->entries);
  *st = (SafeTensors){0};
}

const SafeTensorEntry *safetensors_find(const SafeTensors *st, const char *name) {
  for (int i = 0; i < st->count; i++)
    if (strcmp(st->entries[i].name, name) == 0) return &st->entries[i];
  return NULL;
}

const void *safetensors_entry_data(const SafeTensors *st, const SafeTensorEntry *e) {
  return st->data + e->begin;
}

Tensor safetensors_entry_tensor(const SafeTensors *st, const SafeTensorEntry *e) {
  return tensor_view((void *)safetensors_entry_data(st, e), e->dtype, DEVICE_CPU, e->name, e->ndim,
                     e->shape);
}

const char *safetensors_meta_get(const SafeTensors *st, const char *key) {
  for (int i = 0; i < st->meta_count; i++)
    if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
  return NULL;
}

// ----------------------------------------------------------------------------------------------
// Writer

// An entry that safetensors_writer_add could not represent keeps a negative ndim saying why,
// and save reports it (add has no error channel).
enum { ADD_NAME_TOO_LONG = -1, ADD_BAD_NDIM = -2, ADD_NEGATIVE_DIM = -3, ADD_BAD_DTYPE = -4 };

void safetensors_writer_init(SafeTensorWriter *w) {
  *w = (SafeTensorWriter){0};
}

void safetensors_writer_add(SafeTensorWriter *w, const char *name, DType dtype, int ndim,
                            const int64_t *shape,  // (ndim)
                            const void *data) {    // numel elements of dtype
  // entries and datas grow together and share w->capacity.
  int capacity = w->capacity;
  w->entries = grow(w->entries, w->count, &capacity, sizeof *w->entries);
  w->datas = grow(w->datas, w->count, &w->capacity, sizeof *w->datas);
  SafeTensorEntry *e = &w->entries[w->count];
  *e = (SafeTensorEntry){.dtype = dtype, .ndim = ndim};
  w->datas[w->count++] = data;
  snprintf(e->name, sizeof e->name, "%s", name);
  if (strlen(name) >= sizeof e->name)
    e->ndim = ADD_NAME_TOO_LONG;
  else if (ndim < 0 || ndim > TENSOR_MAX_DIMS)
    e->ndim = ADD_BAD_NDIM;
  else if ((unsigned)dtype > DTYPE_I32)
    e->ndim = ADD_BAD_DTYPE;
  else
    for (int i = 0; i < ndim; i++) {
      e->shape[i] = shape[i];
      if (shape[i] < 0) e->ndim = ADD_NEGATIVE_DIM;
    }
}

void safetensors_writer_add_tensor(SafeTensorWriter *w, const Tensor *t) {
  safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
}

void safetensors_writer_meta(SafeTensorWriter *w, const char *key, const char *value) {
  for (int i = 0; i < w->meta_count; i++)
    if (strcmp(w->meta[i].key, key) == 0) {  // setting a key again replaces its value
      free(w->meta[i].value);
      w->meta[i].value = copy_string(value);
      return;
    }
  w->meta = grow(w->meta, w->meta_count, &w->meta_capacity, sizeof *w->meta);
  w->meta[w->meta_count++] = (SafeTensorMeta){.key = copy_string(key), .value = copy_string(value)};
}

void safetensors_writer_free(SafeTensorWriter *w) {
  for (int i = 0; i < w->meta_count; i++) {
    free(w->meta[i].key);
    free(w->meta[i].value);
  }
  free(w->meta);
  free(w->entries);
  free(w->datas);
  *w = (SafeTensorWriter){0};
}

typedef struct {
  char *s;
  size_t len, capacity;
} TextBuffer;

static void text_append(TextBuffer *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->capacity) {
    size_t capacity = b->capacity ? b->capacity : 4096;
    while (b->len + n + 1 > capacity) capacity *= 2;
    char *bigger = malloc_check(capacity);
    if (b->len) memcpy(bigger, b->s, b->len);
    free(b->s);
    b->s = bigger;
    b->capacity = capacity;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}

static void text_printf(TextBuffer *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(TextBuffer *b, const char *fmt, ...) {
  char piece[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(piece, sizeof piece, fmt, ap);
  va_end(ap);
  text_append(b, piece, (size_t)n);
}

// A JSON string literal: quotes, backslashes and control characters escaped, UTF-8 kept as is.
static void text_json_string(TextBuffer *b, const char *s) {
  text_append(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    const char *named = NULL;
    switch (*c) {
      case '"':
        named = "\\\"";
        break;
      case '\\':
        named = "\\\\";
        break;
      case '\b':
        named = "\\b";
        break;
      case '\f':
        named = "\\f";
        break;
      case '\n':
        named = "\\n";
        break;
      case '\r':
        named = "\\r";
        break;
      case '\t':
        named = "\\t";
        break;
    }
    if (named)
      text_append(b, named, 2);
    else if (*c < 0x20)
      text_printf(b, "\\u%04x", *c);
    else
      text_append(b, (const char *)c, 1);
  }
  text_append(b, "\"", 1);
}

static int check_utf8_string(const char *s, const char *what, const char *path, Error *err) {
  size_t n = strlen(s), bad = utf8_invalid_at((const unsigned char *)s, n);
  if (bad == n) return 0;
  return error_set(err,
                   "cannot save '%s': %s '%.64s' is not valid UTF-8 (byte %zu)\n"
                   "HINT: safetensors headers are JSON text; pass UTF-8 strings",
                   path, what, s, bad);
}

// Everything save can refuse before touching the file system.
static int check_writer(const SafeTensorWriter *w, const char *path, uint64_t *nbytes, Error *err) {
  for (int i = 0; i < w->count; i++) {
    const SafeTensorEntry *e = &w->entries[i];
    switch (e->ndim) {
      case ADD_NAME_TOO_LONG:
        return error_set(err,
                         "cannot save '%s': tensor name '%.64s...' is longer than %zu "
                         "bytes",
                         path, e->name, sizeof e->name - 1);
      case ADD_BAD_NDIM:
        return error_set(err,
                         "cannot save '%s': tensor '%s' has more than %d dimensions (or a "
                         "negative count)",
                         path, e->name, TENSOR_MAX_DIMS);
      case ADD_NEGATIVE_DIM:
        return error_set(err, "cannot save '%s': tensor '%s' has a negative dimension", path,
                         e->name);
      case ADD_BAD_DTYPE:
        return error_set(err, "cannot save '%s': tensor '%s' has an invalid dtype", path, e->name);
    }
    if (strcmp(e->name, "__metadata__") == 0)
      return error_set(err, "cannot save '%s': '__metadata__' is reserved, not a tensor name",
                       path);
    if (check_utf8_string(e->name, "tensor name", path, err) != 0) return -1;
    if (tensor_nbytes(e->dtype, e->ndim, e->shape, &nbytes[i]) != 0)
      return error_set(err, "cannot save '%s': tensor '%s' is too large", path, e->name);
    if (nbytes[i] > 0 && !w->datas[i])
      return error_set(err, "cannot save '%s': tensor '%s' has no data (NULL)", path, e->name);
  }
  const char **names = malloc_check((size_t)(w->count + 1) * sizeof *names);
  for (int i = 0; i < w->count; i++) names[i] = w->entries[i].name;
  const char *dup = find_duplicate(names, w->count);
  free(names);
  if (dup) return error_set(err, "cannot save '%s': tensor '%s' was added twice", path, dup);
  for (int i = 0; i < w->meta_count; i++) {
    if (strcmp(w->meta[i].key, CHECKSUM_KEY) == 0)
      return error_set(err, "cannot save '%s': metadata key '%s' is reserved (save computes it)",
                       path, CHECKSUM_KEY);
    if (check_utf8_string(w->meta[i].key, "metadata key", path, err) != 0 ||
        check_utf8_string(w->meta[i].value, "metadata value", path, err) != 0)
      return -1;
  }
  return 0;
}

// Writes n bytes from src; -1 with errno on a short write.
static int write_fully(FILE *f, const unsigned char *src, uint64_t n) {
  while (n > 0) {
    size_t piece = n < IO_CHUNK ? (size_t)n : IO_CHUNK;
    if (fwrite(src, 1, piece, f) != piece) return -1;
    src += piece;
    n -= piece;
  }
  return 0;
}

// What write_file_atomic writes: the length, the header, then the data in data_order.
typedef struct {
  const SafeTensorWriter *w;
  const unsigned char *length;  // 8 bytes
  const TextBuffer *header;
  const int *data_order;
  const uint64_t *nbytes;
} WriterContents;

static int write_contents(FILE *f, const void *ctx) {
  const WriterContents *c = ctx;
  if (write_fully(f, c->length, 8) != 0 ||
      write_fully(f, (const unsigned char *)c->header->s, c->header->len) != 0)
    return -1;
  for (int k = 0; k < c->w->count; k++) {
    int i = c->data_order[k];
    if (write_fully(f, c->w->datas[i], c->nbytes[i]) != 0) return -1;
  }
  return 0;
}

int safetensors_writer_save(SafeTensorWriter *w, const char *path, Error *err) {
  uint64_t *nbytes = malloc_check((size_t)(w->count + 1) * sizeof *nbytes);
  int *data_order = malloc_check((size_t)(w->count + 1) * sizeof *data_order);
  TextBuffer header = {0};
  int rc = check_writer(w, path, nbytes, err);
  if (rc != 0) goto done;

  // Data section: widest dtype first (stable), as Python's safetensors lays it out, so that
  // every tensor starts at a multiple of its element size; the header keeps insertion order.
  int placed = 0;
  uint64_t offset = 0;
  for (size_t width = 8; width >= 1; width /= 2)
    for (int i = 0; i < w->count; i++)
      if (dtype_size(w->entries[i].dtype) == width) {
        data_order[placed++] = i;
        w->entries[i].begin = offset;
        offset += nbytes[i];
        w->entries[i].end = offset;
      }

  Hasher x = hasher_start();
  hash_header(&x, w->meta, w->meta_count, w->entries, w->count);
  for (int k = 0; k < w->count; k++) {
    int i = data_order[k];
    if (nbytes[i]) hasher_update(&x, w->datas[i], (size_t)nbytes[i]);
  }
  uint64_t h = hasher_finish(&x);

  text_append(&header, "{\"__metadata__\":{", 17);
  for (int i = 0; i < w->meta_count; i++) {
    text_json_string(&header, w->meta[i].key);
    text_append(&header, ":", 1);
    text_json_string(&header, w->meta[i].value);
    text_append(&header, ",", 1);
  }
  text_printf(&header, "\"%s\":\"%016llx\"}", CHECKSUM_KEY, (unsigned long long)h);
  for (int i = 0; i < w->count; i++) {
    const SafeTensorEntry *e = &w->entries[i];
    text_append(&header, ",", 1);
    text_json_string(&header, e->name);
    text_printf(&header, ":{\"dtype\":\"%s\",\"shape\":[", dtype_name(e->dtype));
    for (int d = 0; d < e->ndim; d++)
      text_printf(&header, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    text_printf(&header, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)e->begin,
                (unsigned long long)e->end);
  }
  text_append(&header, "}", 1);
  // Spaces (valid JSON whitespace) pad the header so the data section starts 8-byte aligned.
  while (header.len % 8) text_append(&header, " ", 1);
  unsigned char length[8];
  write_le64(length, header.len);

  WriterContents contents = {w, length, &header, data_order, nbytes};
  rc = write_file_atomic(path, write_contents, &contents, err);
done:
  free(nbytes);
  free(data_order);
  free(header.s);
  return rc;
}

// ----------------------------------------------------------------------------------------------
// fp32 <-> bf16 / fp16

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

uint16_t f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  // A NaN keeps its sign and top payload bits, with the quiet bit set so that a payload living
  // only in the low bits does not truncate to infinity.
  if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((u >> 16) | 0x0040);
  // Round to nearest even: add just under half an ulp, plus one when the kept lsb is odd.
  // A carry into the exponent is the correct result, up to infinity.
  u += 0x7FFF + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

float bf16_to_f32(uint16_t x) {
  return f32_from_bits((uint32_t)x << 16);
}

uint16_t f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7FFFFFFF;
  if (a > 0x7F800000) return (uint16_t)(sign | 0x7E00 | ((a >> 13) & 0x3FF));  // quiet NaN
  // 65520 is halfway between 65504 (the largest half) and 65536: ties go to even, i.e. to inf.
  if (a >= 0x477FF000) return sign | 0x7C00;
  if (a >= 0x38800000) {  // a normal half (>= 2^-14): rebias the exponent from 127 to 15
    uint32_t r = a - ((uint32_t)(127 - 15) << 23);
    r += 0x0FFF + ((r >> 13) & 1);  // round to nearest even at the 10-bit mantissa
    return (uint16_t)(sign | (r >> 13));
  }
  // A subnormal half is m * 2^-24: shift the full 24-bit significand down to that unit.
  int exponent = (int)(a >> 23);
  if (exponent < 102) return sign;  // below 2^-25, which is the tie with zero: rounds to 0
  uint32_t significand = (a & 0x7FFFFF) | 0x800000;
  int shift = 126 - exponent;  // 14..24
  uint32_t m = significand >> shift;
  uint32_t rest = significand & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (m & 1))) m++;  // m == 0x400 is the smallest normal
  return (uint16_t)(sign | m);
}

float f16_to_f32(uint16_t x) {
  uint32_t sign = (uint32_t)(x & 0x8000) << 16;
  uint32_t exponent = (x >> 10) & 0x1F, mantissa = x & 0x3FF;
  if (exponent == 0x1F) return f32_from_bits(sign | 0x7F800000 | (mantissa << 13));
  if (exponent == 0) {
    float magnitude = (float)mantissa * 0x1p-24f;  // exact: mantissa < 2^10
    return sign ? -magnitude : magnitude;
  }
  return f32_from_bits(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}
