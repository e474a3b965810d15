// test_safetensors.c: the safetensors reader and writer (round trips, a file laid out as
// Python's safetensors writes it, malformed and corrupted files, atomic saves) and the
// fp32 <-> bf16 / fp16 conversions.
#define _XOPEN_SOURCE 700  // mkdtemp, mkdir, rmdir, unlink: POSIX, not C11

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/io/safetensors.h"
#include "tests/util/test_util.h"

static char tmp_dir[64];

static void tmp_path(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", tmp_dir, name);
}

// Removes what a failed check may have left in the temp directory, then the directory.
static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *entry;
  while ((entry = readdir(d)) != NULL) {
    if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
    struct stat info;
    if (lstat(path, &info) == 0 && S_ISDIR(info.st_mode))
      remove_tree(path);
    else
      unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static bool path_exists(const char *path) {
  struct stat info;
  return stat(path, &info) == 0;
}

static unsigned char *load(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *bytes = malloc(*size + 1);
  if (fread(bytes, 1, *size, f) != *size) *size = 0;
  fclose(f);
  return bytes;
}

static size_t find_bytes(const unsigned char *hay, size_t n, const char *needle) {
  size_t m = strlen(needle);
  for (size_t i = 0; i + m <= n; i++)
    if (memcmp(hay + i, needle, m) == 0) return i;
  return (size_t)-1;
}

// A file from a header string and data_size bytes of (nonzero, random) data.
static unsigned char *make_file(const char *header, size_t data_size, size_t *size, TestRng *rng) {
  size_t n = strlen(header);
  *size = 8 + n + data_size;
  unsigned char *bytes = malloc(*size);
  for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(bytes + 8, header, n);
  for (size_t i = 0; i < data_size; i++)
    bytes[8 + n + i] = (unsigned char)(1 + test_rng_u64(rng) % 255);
  return bytes;
}

static bool is_empty(const SafeTensors *st) {
  return st->file == NULL && st->entries == NULL && st->count == 0 && st->meta == NULL &&
         st->meta_count == 0;
}

// The parse must fail, leave st empty, and say `expect` (and every string in `also`).
static void expect_refused(const char *what, const unsigned char *bytes, size_t size,
                           const char *expect, const char *also) {
  SafeTensors st;
  memset(&st, 0x5A, sizeof st);  // poison: the parser must clear it
  Error err = {{0}};
  int rc = safetensors_parse(&st, bytes, size, "bad.safetensors", &err);
  bool ok = rc == -1 && is_empty(&st) && strstr(err.msg, expect) &&
            strstr(err.msg, "bad.safetensors") && (!also || strstr(err.msg, also));
  int first_line = (int)strcspn(err.msg, "\n");
  test_check(ok, "refuses %-34s -> %.*s", what, rc == 0 ? 11 : first_line,
             rc == 0 ? "(accepted!)" : err.msg);
  if (!ok)
    printf("     expected '%s'%s%s; full message:\n%s\n", expect, also ? " and " : "",
           also ? also : "", err.msg);
  safetensors_free(&st);
}

static void expect_header_refused(const char *what, const char *header, size_t data_size,
                                  const char *expect, const char *also, TestRng *rng) {
  size_t size;
  unsigned char *bytes = make_file(header, data_size, &size, rng);
  expect_refused(what, bytes, size, expect, also);
  free(bytes);
}

// ----------------------------------------------------------------------------------------------

static void test_round_trip(TestRng *rng) {
  float a[3 * 5], scalar[1], six[8];
  uint16_t b[4], h[12];
  unsigned char u[7];
  int32_t i32[4] = {-7, 0x12345678, 3, -2147483647 - 1};
  test_fill_uniform(rng, a, 15, -3.0f, 3.0f);
  test_fill_uniform(rng, scalar, 1, 1.0f, 2.0f);
  test_fill_uniform(rng, six, 8, -1.0f, 1.0f);
  for (int i = 0; i < 4; i++) b[i] = f32_to_bf16(test_rng_uniform(rng, -5.0f, 5.0f));
  for (int i = 0; i < 12; i++) h[i] = f32_to_f16(test_rng_uniform(rng, -5.0f, 5.0f));
  for (int i = 0; i < 7; i++) u[i] = (unsigned char)(1 + test_rng_u64(rng) % 255);
  float empty_dummy = 1.0f;

  // U8 with an odd size comes before the F32 tensors, so the writer must reorder the data
  // section to keep every tensor aligned to its element size.
  struct {
    const char *name;
    DType dtype;
    int ndim;
    int64_t shape[TENSOR_MAX_DIMS];
    const void *data;
  } t[] = {
      {"bytes.u8", DTYPE_U8, 1, {7}, u},
      {"layers.0.blocks.1.attn.qkv.weight", DTYPE_F32, 2, {3, 5}, a},
      {"bf16 \"quoted\" name", DTYPE_BF16, 1, {4}, b},
      {"half", DTYPE_F16, 3, {2, 3, 2}, h},
      {"ints", DTYPE_I32, 2, {2, 2}, i32},
      {"scalar", DTYPE_F32, 0, {0}, scalar},
      {"empty", DTYPE_F32, 2, {0, 4}, &empty_dummy},
      {"six.dims", DTYPE_F32, 6, {1, 2, 1, 2, 1, 2}, six},
  };
  const int nt = (int)(sizeof t / sizeof t[0]);
  const char *config = "[model]\nname = \"swin_tiny\"\ttab\\backslash\r\n/slash \x01 ctl";
  const char *note = "Grüße – 日本語 😀";

  SafeTensorWriter w;
  safetensors_writer_init(&w);
  safetensors_writer_meta(&w, "config", config);
  safetensors_writer_meta(&w, "step", "0");
  safetensors_writer_meta(&w, "note \"ü\"", note);
  safetensors_writer_meta(&w, "step", "1234");  // a second set replaces the value
  for (int i = 0; i < nt; i++)
    safetensors_writer_add(&w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, t[i].data);
  char path[256];
  tmp_path(path, sizeof path, "round trip.safetensors");
  Error err = {{0}};
  int rc = safetensors_writer_save(&w, path, &err);
  safetensors_writer_free(&w);
  test_check(rc == 0, "round trip: save '%s' %s", path, rc == 0 ? "" : err.msg);
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  test_check(!path_exists(tmp), "round trip: no temp file left after a save");

  size_t size = 0;
  unsigned char *raw = load(path, &size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | raw[i];
  test_check(n % 8 == 0 && size >= 8 + n, "round trip: header length %llu is a multiple of 8",
             (unsigned long long)n);
  const char *start = "{\"__metadata__\":{\"config\":";
  test_check(memcmp(raw + 8, start, strlen(start)) == 0,
             "round trip: header starts with __metadata__, keys in insertion order");
  bool ordered = true;
  size_t last = 0;
  for (int i = 0; i < nt; i++) {
    char key[300];
    snprintf(key, sizeof key, ",\"%s\":{", i == 2 ? "bf16 \\\"quoted\\\" name" : t[i].name);
    size_t at = find_bytes(raw + 8, (size_t)n, key);
    ordered &= at != (size_t)-1 && at > last;
    last = at;
  }
  test_check(ordered, "round trip: tensor entries in insertion order in the header");
  free(raw);

  SafeTensors st;
  rc = safetensors_read(&st, path, &err);
  test_check(rc == 0, "round trip: read back %s", rc == 0 ? "" : err.msg);
  if (rc != 0) return;
  test_check(st.count == nt, "round trip: %d tensors (want %d)", st.count, nt);
  test_check(st.has_checksum, "round trip: checksum present and verified");
  for (int i = 0; i < nt && i < st.count; i++) {
    const SafeTensorEntry *e = &st.entries[i];
    bool same = strcmp(e->name, t[i].name) == 0 && e->dtype == t[i].dtype && e->ndim == t[i].ndim;
    int64_t numel = 1;
    for (int d = 0; d < t[i].ndim; d++) {
      same &= e->shape[d] == t[i].shape[d];
      numel *= t[i].shape[d];
    }
    size_t nbytes = (size_t)numel * dtype_size(t[i].dtype);
    const void *data = safetensors_entry_data(&st, e);
    same &= e->end - e->begin == nbytes && memcmp(data, t[i].data, nbytes) == 0;
    same &= safetensors_find(&st, t[i].name) == e;
    bool aligned = (uintptr_t)data % dtype_size(e->dtype) == 0;
    test_check(same && aligned, "round trip: %-36s %s, %zu bytes, %s", t[i].name,
               dtype_name(t[i].dtype), nbytes, aligned ? "aligned" : "MISALIGNED");
  }
  test_check((uintptr_t)st.data % 64 == 0, "round trip: data section is 64-byte aligned");
  const char *got = safetensors_meta_get(&st, "config");
  test_check(got && strcmp(got, config) == 0,
             "round trip: metadata with quotes, newlines, tab, backslash, control char");
  got = safetensors_meta_get(&st, "note \"ü\"");
  test_check(got && strcmp(got, note) == 0, "round trip: non-ASCII metadata key and value (%s)",
             got ? got : "missing");
  got = safetensors_meta_get(&st, "step");
  test_check(got && strcmp(got, "1234") == 0, "round trip: metadata set twice keeps the last");
  got = safetensors_meta_get(&st, "swin.checksum");
  test_check(got && strlen(got) == 16 && strspn(got, "0123456789abcdef") == 16,
             "round trip: swin.checksum is 16 lowercase hex digits (%s)", got ? got : "missing");
  test_check(safetensors_find(&st, "nope") == NULL && !safetensors_meta_get(&st, "nope"),
             "round trip: absent names give NULL");
  safetensors_free(&st);
  test_check(is_empty(&st), "round trip: free leaves the struct empty");
  unlink(path);
}

// Laid out as Python's safetensors writes it: compact JSON, __metadata__ first, data sorted by
// dtype width, header padded with spaces to 8 bytes, no checksum. Plus escapes a hand-written
// or other writer's file may use.
static void test_python_layout(void) {
  const char *header =
      "{\"__metadata__\":{\"format\":\"pt\",\"emoji\":\"\\ud83d\\ude00\"},"
      "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"na\\u00efve\\/id\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[12,14]},"
      "\"empty\":{\"dtype\":\"F16\",\"shape\":[3,0],\"data_offsets\":[14,14]},"
      "\"c\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[14,17]}}";
  size_t n = strlen(header), padded = (n + 7) / 8 * 8;
  unsigned char bytes[512] = {0};
  for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)(padded >> (8 * i));
  memcpy(bytes + 8, header, n);
  memset(bytes + 8 + n, ' ', padded - n);
  unsigned char *data = bytes + 8 + padded;
  const unsigned char payload[17] = {0x00, 0x00, 0xC0, 0x3F,  // 1.5f
                                     0x00, 0x00, 0x00, 0xC0,  // -2.0f
                                     0x07, 0x00, 0x00, 0x00,  // 7
                                     0x80, 0x3F,              // bf16 1.0
                                     1,    2,    3};
  memcpy(data, payload, sizeof payload);
  char path[256];
  tmp_path(path, sizeof path, "python.safetensors");
  test_write_file(path, bytes, 8 + padded + sizeof payload);

  SafeTensors st;
  Error err = {{0}};
  int rc = safetensors_read(&st, path, &err);
  test_check(rc == 0, "python layout: parses %s", rc == 0 ? "" : err.msg);
  if (rc != 0) return;
  test_check(!st.has_checksum && st.count == 5 && st.meta_count == 2,
             "python layout: 5 tensors, 2 metadata keys, no checksum");
  const SafeTensorEntry *a = safetensors_find(&st, "a.weight");
  const float *af = a ? safetensors_entry_data(&st, a) : NULL;
  test_check(a && a->dtype == DTYPE_F32 && a->ndim == 1 && a->shape[0] == 2 && af[0] == 1.5f &&
                 af[1] == -2.0f,
             "python layout: F32 a.weight = [1.5, -2]");
  const SafeTensorEntry *id = safetensors_find(&st, "na\xc3\xafve/id");
  test_check(id && id->dtype == DTYPE_I32 && *(const int32_t *)safetensors_entry_data(&st, id) == 7,
             "python layout: name with \\u00ef and \\/ escapes, I32 = 7");
  const SafeTensorEntry *b = safetensors_find(&st, "b");
  test_check(
      b && b->ndim == 0 && bf16_to_f32(*(const uint16_t *)safetensors_entry_data(&st, b)) == 1.0f,
      "python layout: 0-d BF16 scalar = 1");
  const SafeTensorEntry *e = safetensors_find(&st, "empty");
  test_check(e && e->ndim == 2 && e->shape[1] == 0 && e->begin == e->end,
             "python layout: F16 tensor with a 0 dim");
  const SafeTensorEntry *c = safetensors_find(&st, "c");
  const unsigned char *cu = c ? safetensors_entry_data(&st, c) : NULL;
  test_check(c && cu[0] == 1 && cu[2] == 3, "python layout: U8 c = [1, 2, 3]");
  const char *emoji = safetensors_meta_get(&st, "emoji");
  test_check(emoji && strcmp(emoji, "\xf0\x9f\x98\x80") == 0,
             "python layout: surrogate pair decodes to UTF-8 U+1F600");
  safetensors_free(&st);

  // The same header with JSON whitespace everywhere it is allowed.
  const char *spaced =
      " {\n  \"__metadata__\" : { \"format\" : \"pt\" } ,\r\n\t\"x\" : { \"dtype\" : \"U8\" , "
      "\"shape\" : [ 2 , 1 ] , \"data_offsets\" : [ 0 , 2 ] }\n} ";
  n = strlen(spaced);
  for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(bytes + 8, spaced, n);
  bytes[8 + n] = 9, bytes[9 + n] = 10;
  rc = safetensors_parse(&st, bytes, 8 + n + 2, "spaced", &err);
  test_check(rc == 0 && st.count == 1 && st.entries[0].shape[0] == 2,
             "python layout: JSON whitespace everywhere %s", rc == 0 ? "" : err.msg);
  safetensors_free(&st);
  unlink(path);
}

static void test_malformed(TestRng *rng) {
  const char *ok_entry = "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
  char header[1024];

  unsigned char four[4] = {8, 0, 0, 0};
  expect_refused("truncated to 4 bytes", four, 4, "too short", "HINT:");
  expect_refused("empty file", four, 0, "too short", NULL);
  // A real file cut to 4 bytes, through the file reader.
  char path[256];
  tmp_path(path, sizeof path, "short.safetensors");
  test_write_file(path, four, 4);
  SafeTensors st;
  Error err = {{0}};
  int rc = safetensors_read(&st, path, &err);
  test_check(rc == -1 && strstr(err.msg, "too short") && strstr(err.msg, path) && is_empty(&st),
             "refuses a 4-byte file on disk, naming it");
  unlink(path);
  tmp_path(path, sizeof path, "does-not-exist.safetensors");
  rc = safetensors_read(&st, path, &err);
  test_check(rc == -1 && strstr(err.msg, "No such file") && strstr(err.msg, path),
             "refuses a missing file, naming it");

  unsigned char huge[64] = {0};
  huge[7] = 0x10;  // 2^60
  expect_refused("header length 2^60", huge, sizeof huge, "100 MB limit", NULL);
  huge[7] = 0, huge[0] = 200;  // 200 bytes in a 64-byte file
  expect_refused("header length beyond the file", huge, sizeof huge, "beyond the end of the file",
                 NULL);

  // JSON syntax: each with its byte offset.
  expect_header_refused("JSON: not an object", "[1,2]", 0, "expected '{'", "header byte 0", rng);
  expect_header_refused("JSON: missing ':'", "{\"w\" {\"dtype\":\"F32\"}}", 0, "expected ':'",
                        "header byte 5", rng);
  expect_header_refused("JSON: unterminated string", "{\"w", 0, "unterminated string", NULL, rng);
  snprintf(header, sizeof header, "{%s,}", ok_entry);
  expect_header_refused("JSON: trailing comma", header, 8, "expected a string", NULL, rng);
  expect_header_refused("JSON: fraction in shape",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
                        "fraction", NULL, rng);
  expect_header_refused("JSON: negative offset",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1,8]}}", 8,
                        "negative", NULL, rng);
  expect_header_refused("JSON: leading zero",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", 8,
                        "leading zeros", NULL, rng);
  expect_header_refused("JSON: integer over 64 bits",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
                        "18446744073709551616]}}",
                        8, "too large", NULL, rng);
  expect_header_refused("JSON: bad escape \\x", "{\"w\\x\":{}}", 0, "invalid escape", NULL, rng);
  expect_header_refused("JSON: short \\u escape", "{\"w\\u12\":{}}", 0, "4 hex digits", NULL, rng);
  expect_header_refused("JSON: lone high surrogate", "{\"w\\ud83d\":{}}", 0, "surrogate", NULL,
                        rng);
  expect_header_refused("JSON: lone low surrogate", "{\"w\\ude00\":{}}", 0, "surrogate", NULL, rng);
  expect_header_refused("JSON: \\u0000 in a name", "{\"w\\u0000x\":{}}", 0, "NUL", NULL, rng);
  expect_header_refused("JSON: raw newline in a string", "{\"w\nx\":{}}", 0, "control character",
                        NULL, rng);
  expect_header_refused("JSON: invalid UTF-8", "{\"w\xff\":{}}", 0, "not valid UTF-8", NULL, rng);
  expect_header_refused("JSON: null metadata", "{\"__metadata__\":null}", 0, "expected '{'", NULL,
                        rng);
  expect_header_refused("JSON: number as metadata value", "{\"__metadata__\":{\"step\":5}}", 0,
                        "expected a string", NULL, rng);
  snprintf(header, sizeof header, "{%s} x", ok_entry);
  expect_header_refused("JSON: data after the object", header, 8, "after the header object", NULL,
                        rng);
  snprintf(header, sizeof header, "{%s", ok_entry);
  expect_header_refused("JSON: object never closed", header, 8, "expected ',' or '}'", NULL, rng);
  expect_header_refused("JSON: empty header", "", 0, "expected '{'", NULL, rng);

  // Well-formed JSON describing something wrong: the message names the tensor.
  expect_header_refused("missing dtype", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                        "missing \"dtype\"", "'w'", rng);
  expect_header_refused("missing shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8,
                        "missing \"shape\"", "'w'", rng);
  expect_header_refused("missing data_offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
                        "missing \"data_offsets\"", "'w'", rng);
  expect_header_refused("unknown field",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}",
                        8, "unknown field \"x\"", "'w'", rng);
  expect_header_refused("repeated field",
                        "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],"
                        "\"data_offsets\":[0,8]}}",
                        8, "repeated field \"dtype\"", "'w'", rng);
  expect_header_refused("three data_offsets",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 9,
                        "data_offsets must be [begin, end]", "'w'", rng);
  expect_header_refused("offsets beyond the data",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                        "beyond the data section", "'w'", rng);
  expect_header_refused("begin > end",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                        "begin after end", "'w'", rng);
  expect_header_refused("shape/size mismatch",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,8]}}", 8,
                        "needs 24 bytes", "'w'", rng);
  expect_header_refused("shape product overflow",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                        "\"data_offsets\":[0,8]}}",
                        8, "too large", "'w'", rng);
  expect_header_refused("dtype F64",
                        "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                        "unsupported dtype \"F64\"", "'w'", rng);
  expect_header_refused("dtype Q4",
                        "{\"w\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                        "unsupported dtype \"Q4\"", "HINT:", rng);
  expect_header_refused("overlapping ranges",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                        12, "overlap", "'v'", rng);
  expect_header_refused("gap between tensors",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
                        16, "gap", "'v'", rng);
  expect_header_refused("gap at the start",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                        "gap", "[0, 4)", rng);
  expect_header_refused("uncovered trailing bytes",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 11,
                        "last 3 bytes", NULL, rng);
  expect_header_refused("duplicate name",
                        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        8, "appears twice", "'w'", rng);
  expect_header_refused("duplicate metadata key", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                        "appears twice", "'k'", rng);
  expect_header_refused("7 dimensions",
                        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1],"
                        "\"data_offsets\":[0,1]}}",
                        1, "more than 6 dimensions", "'w'", rng);
  char long_name[400];
  memset(long_name, 'n', 300);
  long_name[300] = 0;
  snprintf(header, sizeof header,
           "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", long_name);
  expect_header_refused("name longer than 255 bytes", header, 1, "longer than the 255", NULL, rng);
  expect_header_refused("malformed checksum", "{\"__metadata__\":{\"swin.checksum\":\"XYZ\"}}", 0,
                        "not 16 lowercase hex digits", NULL, rng);
}

// Writes a small checksummed file and returns its bytes.
static unsigned char *checksummed_file(const char *path, size_t *size, TestRng *rng) {
  float x[64];
  test_fill_uniform(rng, x, 64, -1.0f, 1.0f);
  int64_t shape[2] = {8, 8};
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  safetensors_writer_meta(&w, "config", "model=swin_tiny");
  safetensors_writer_add(&w, "x", DTYPE_F32, 2, shape, x);
  Error err = {{0}};
  if (safetensors_writer_save(&w, path, &err) != 0) printf("     save failed: %s\n", err.msg);
  safetensors_writer_free(&w);
  return load(path, size);
}

static void test_checksum(TestRng *rng) {
  char path[256];
  tmp_path(path, sizeof path, "checksummed.safetensors");
  size_t size = 0;
  unsigned char *bytes = checksummed_file(path, &size, rng);
  SafeTensors st;
  Error err = {{0}};
  int rc = safetensors_parse(&st, bytes, size, "intact", &err);
  test_check(rc == 0 && st.has_checksum, "checksum: intact file verifies %s",
             rc == 0 ? "" : err.msg);
  safetensors_free(&st);

  bytes[size - 100] ^= 0x01;  // one bit of one data byte
  expect_refused("one flipped data byte", bytes, size, "checksum mismatch: the file is corrupted",
                 "HINT: use an older checkpoint");
  bytes[size - 100] ^= 0x01;
  size_t at = find_bytes(bytes, size, "swin_tiny");
  bytes[at] = 'S';  // one metadata byte, still valid JSON
  expect_refused("one changed metadata byte", bytes, size, "checksum mismatch", NULL);
  bytes[at] = 's';
  at = find_bytes(bytes, size, "\"config\"");
  bytes[at + 1] = 'C';  // one byte of a metadata key
  expect_refused("one changed metadata key byte", bytes, size, "checksum mismatch", NULL);
  free(bytes);
  unlink(path);
}

// Every truncation of a valid file is refused, and random byte changes in its header are
// refused or yield entries inside the data section: the reader never trusts what it parses.
static void test_mangled(TestRng *rng) {
  char path[256];
  tmp_path(path, sizeof path, "mangled.safetensors");
  size_t size = 0;
  unsigned char *bytes = checksummed_file(path, &size, rng);
  unlink(path);
  SafeTensors st;
  Error err = {{0}};
  int accepted = 0;
  for (size_t n = 0; n < size; n++) {
    accepted += safetensors_parse(&st, bytes, n, "truncated", &err) == 0;
    safetensors_free(&st);
  }
  test_check(accepted == 0, "refuses all %zu truncations of a valid file (%d accepted)", size,
             accepted);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | bytes[i];
  unsigned char *copy = malloc(size);
  int escaped = 0, refused = 0;
  for (int trial = 0; trial < 3000; trial++) {
    memcpy(copy, bytes, size);
    size_t at = (size_t)(test_rng_u64(rng) % (8 + header_len));
    copy[at] = (unsigned char)test_rng_u64(rng);
    if (safetensors_parse(&st, copy, size, "mangled", &err) != 0) {
      refused++;
      continue;
    }
    for (int i = 0; i < st.count; i++)
      escaped += st.entries[i].begin > st.entries[i].end || st.entries[i].end > st.data_size;
    safetensors_free(&st);
  }
  test_check(escaped == 0, "3000 random header byte changes: %d refused, none out of range",
             refused);
  free(copy);
  free(bytes);
}

static void test_atomic_save(TestRng *rng) {
  float x[16];
  test_fill_uniform(rng, x, 16, -1.0f, 1.0f);
  int64_t shape[1] = {16};
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  safetensors_writer_add(&w, "x", DTYPE_F32, 1, shape, x);
  Error err = {{0}};

  char path[256], tmp[300];
  tmp_path(path, sizeof path, "missing-dir/model.safetensors");
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int rc = safetensors_writer_save(&w, path, &err);
  test_check(rc == -1 && strstr(err.msg, path) && strstr(err.msg, "No such file or directory") &&
                 strstr(err.msg, "HINT:"),
             "save into a missing directory fails clearly: %.90s", err.msg);
  test_check(!path_exists(tmp) && !path_exists(path),
             "save into a missing directory leaves nothing");

  // Saving over an existing file replaces it.
  tmp_path(path, sizeof path, "replace.safetensors");
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  rc = safetensors_writer_save(&w, path, &err);
  x[0] = 42.0f;
  rc |= safetensors_writer_save(&w, path, &err);
  SafeTensors st;
  rc |= safetensors_read(&st, path, &err);
  test_check(rc == 0 && ((const float *)safetensors_entry_data(&st, &st.entries[0]))[0] == 42.0f,
             "save over an existing file replaces it %s", rc == 0 ? "" : err.msg);
  safetensors_free(&st);

  // A failing save (PATH.tmp cannot be created: it is a directory) leaves the old file intact.
  size_t before_size = 0, after_size = 0;
  unsigned char *before = load(path, &before_size);
  mkdir(tmp, 0755);
  x[0] = -1.0f;
  rc = safetensors_writer_save(&w, path, &err);
  test_check(rc == -1 && strstr(err.msg, tmp) && strstr(err.msg, "Is a directory"),
             "save with PATH.tmp a directory fails: %.90s", err.msg);
  unsigned char *after = load(path, &after_size);
  test_check(after && after_size == before_size && memcmp(before, after, before_size) == 0,
             "failed save leaves the old file byte for byte");
  struct stat info;
  test_check(stat(tmp, &info) == 0 && S_ISDIR(info.st_mode),
             "failed save does not remove a PATH.tmp it did not create");
  rmdir(tmp);
  free(before), free(after);

  // A target that is not a regular file (a directory, a FIFO; as root a device such as
  // /dev/null) is refused before anything is written: the rename would replace it.
  char dir_path[256];
  tmp_path(dir_path, sizeof dir_path, "is-a-dir.safetensors");
  mkdir(dir_path, 0755);
  char inner[300];
  snprintf(inner, sizeof inner, "%s/keep", dir_path);
  test_write_file(inner, (const unsigned char *)"k", 1);
  rc = safetensors_writer_save(&w, dir_path, &err);
  snprintf(tmp, sizeof tmp, "%s.tmp", dir_path);
  test_check(rc == -1 && strstr(err.msg, "not a regular file (a directory)") &&
                 strstr(err.msg, "HINT:") && !path_exists(tmp) && path_exists(inner),
             "save onto a directory is refused, nothing written, target untouched: %.80s", err.msg);
  unlink(inner);
  rmdir(dir_path);
  char fifo[256];
  tmp_path(fifo, sizeof fifo, "fifo.safetensors");
  test_check(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
  rc = safetensors_writer_save(&w, fifo, &err);
  snprintf(tmp, sizeof tmp, "%s.tmp", fifo);
  test_check(rc == -1 && strstr(err.msg, "a device, pipe or socket") && !path_exists(tmp) &&
                 stat(fifo, &info) == 0 && S_ISFIFO(info.st_mode),
             "save onto a FIFO is refused and the FIFO stays: %.80s", err.msg);
  unlink(fifo);
  unlink(path);

  // What the writer refuses before touching the disk.
  tmp_path(path, sizeof path, "refused.safetensors");
  safetensors_writer_add(&w, "x", DTYPE_F32, 1, shape, x);
  rc = safetensors_writer_save(&w, path, &err);
  test_check(rc == -1 && strstr(err.msg, "'x' was added twice") && !path_exists(path),
             "save refuses a duplicate tensor name");
  safetensors_writer_free(&w);
  safetensors_writer_init(&w);
  safetensors_writer_meta(&w, "swin.checksum", "0000000000000000");
  rc = safetensors_writer_save(&w, path, &err);
  test_check(rc == -1 && strstr(err.msg, "reserved"), "save refuses a user swin.checksum");
  safetensors_writer_free(&w);
  safetensors_writer_init(&w);
  char long_name[300];
  memset(long_name, 'n', 299);
  long_name[299] = 0;
  safetensors_writer_add(&w, long_name, DTYPE_F32, 1, shape, x);
  rc = safetensors_writer_save(&w, path, &err);
  test_check(rc == -1 && strstr(err.msg, "longer than 255"), "save refuses a 299-byte name");
  safetensors_writer_free(&w);
  safetensors_writer_init(&w);
  int64_t seven[7] = {1, 1, 1, 1, 1, 1, 16};
  safetensors_writer_add(&w, "seven", DTYPE_F32, 7, seven, x);
  rc = safetensors_writer_save(&w, path, &err);
  test_check(rc == -1 && strstr(err.msg, "more than 6"), "save refuses 7 dimensions");
  safetensors_writer_free(&w);
  safetensors_writer_init(&w);
  safetensors_writer_meta(&w, "bad", "\xc3\x28");
  rc = safetensors_writer_save(&w, path, &err);
  test_check(rc == -1 && strstr(err.msg, "UTF-8"), "save refuses invalid UTF-8 metadata");
  safetensors_writer_free(&w);
  test_check(!path_exists(path), "refused saves create no file");

  // No tensors at all is a valid file.
  safetensors_writer_init(&w);
  rc = safetensors_writer_save(&w, path, &err);
  safetensors_writer_free(&w);
  rc |= safetensors_read(&st, path, &err);
  test_check(rc == 0 && st.count == 0 && st.data_size == 0 && st.has_checksum,
             "a file with no tensors round-trips %s", rc == 0 ? "" : err.msg);
  safetensors_free(&st);
  unlink(path);
}

// ----------------------------------------------------------------------------------------------

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static void test_bf16(TestRng *rng) {
  int exact = 1;
  for (int i = 0; i < 100000; i++) {
    uint32_t u = (uint32_t)test_rng_u64(rng) & 0xFFFF0000u;
    if ((u & 0x7F800000) == 0x7F800000) continue;  // inf/NaN checked below
    exact &= f32_to_bf16(float_of(u)) == (uint16_t)(u >> 16) &&
             bits_of(bf16_to_f32((uint16_t)(u >> 16))) == u;
  }
  test_check(exact, "bf16: representable values convert exactly (1e5 random)");
  struct {
    uint32_t f32;
    uint16_t want;
    const char *what;
  } cases[] = {
      {0x3F808000, 0x3F80, "tie 1 + 2^-8 -> 1 (even)"},
      {0x3F818000, 0x3F82, "tie 1 + 3 * 2^-8 -> 1 + 2^-6 (even)"},
      {0x3F808001, 0x3F81, "just above the tie rounds up"},
      {0x3F807FFF, 0x3F80, "just below the tie rounds down"},
      {0xBF818000, 0xBF82, "negative tie -> even"},
      {0x7F800000, 0x7F80, "+inf"},
      {0xFF800000, 0xFF80, "-inf"},
      {0x7F7FFFFF, 0x7F80, "FLT_MAX rounds to inf (above the last midpoint)"},
      {0x00000001, 0x0000, "smallest f32 subnormal -> +0"},
      {0x80000000, 0x8000, "-0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint16_t got = f32_to_bf16(float_of(cases[i].f32));
    test_check(got == cases[i].want, "bf16: %-46s 0x%08x -> 0x%04x (want 0x%04x)", cases[i].what,
               cases[i].f32, got, cases[i].want);
  }
  // A signaling NaN whose payload sits in the low 16 bits must not become inf.
  uint16_t snan = f32_to_bf16(float_of(0x7F800001)), qnan = f32_to_bf16(NAN);
  test_check(
      isnan(bf16_to_f32(snan)) && isnan(bf16_to_f32(qnan)) && isnan(bf16_to_f32(f32_to_bf16(-NAN))),
      "bf16: NaN stays NaN, low-payload NaN too (0x%04x, 0x%04x)", snan, qnan);
  double worst = 0;
  for (int i = 0; i < 100000; i++) {
    float x = expf(test_rng_uniform(rng, -60.0f, 60.0f)) * (test_rng_u64(rng) & 1 ? 1 : -1);
    double e = fabs((double)bf16_to_f32(f32_to_bf16(x)) - x) / fabs((double)x);
    if (!(e <= worst)) worst = e;
  }
  // 8 significant bits: round to nearest is within half an ulp, 2^-8 relative.
  test_check(worst <= 0x1p-8, "bf16: max rel err f32->bf16->f32 %.3e (tol 2^-8 = %.3e)", worst,
             0x1p-8);
}

static void test_f16(TestRng *rng) {
  int exact = 1, nan_ok = 1;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float x = f16_to_f32((uint16_t)h);
    if (((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF))
      nan_ok &= isnan(x) && isnan(f16_to_f32(f32_to_f16(x)));
    else
      exact &= f32_to_f16(x) == h;
  }
  test_check(exact, "f16: all 63488 non-NaN halves (subnormals, inf) convert exactly both ways");
  test_check(nan_ok, "f16: every NaN half stays NaN through f32 and back");
  struct {
    float x;
    uint16_t want;
    const char *what;
  } cases[] = {
      {1.0f + 0x1p-11f, 0x3C00, "tie 1 + 2^-11 -> 1 (even)"},
      {1.0f + 3 * 0x1p-11f, 0x3C02, "tie 1 + 3 * 2^-11 -> 1 + 2^-9 (even)"},
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01, "just above the tie rounds up"},
      {65504.0f, 0x7BFF, "65504 = largest half"},
      {65519.0f, 0x7BFF, "65519 rounds down to 65504"},
      {65520.0f, 0x7C00, "65520 (tie) rounds to inf"},
      {1e6f, 0x7C00, "1e6 overflows to inf"},
      {-1e6f, 0xFC00, "-1e6 overflows to -inf"},
      {INFINITY, 0x7C00, "+inf"},
      {0x1p-14f, 0x0400, "2^-14 = smallest normal"},
      {0x1p-14f - 0x1p-25f, 0x0400, "tie between largest subnormal and 2^-14 -> even"},
      {0x1p-24f, 0x0001, "2^-24 = smallest subnormal"},
      {0x1p-25f, 0x0000, "2^-25 (tie with 0) -> 0 (even)"},
      {0x1p-25f * 1.0001f, 0x0001, "just above 2^-25 rounds up to 2^-24"},
      {1.5f * 0x1p-24f, 0x0002, "tie 1.5 * 2^-24 -> 2 (even)"},
      {2.5f * 0x1p-24f, 0x0002, "tie 2.5 * 2^-24 -> 2 (even)"},
      {-3.0f * 0x1p-24f, 0x8003, "-3 * 2^-24 exact subnormal"},
      {1e-10f, 0x0000, "1e-10 underflows to +0"},
      {-0.0f, 0x8000, "-0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint16_t got = f32_to_f16(cases[i].x);
    test_check(got == cases[i].want, "f16: %-48s -> 0x%04x (want 0x%04x)", cases[i].what, got,
               cases[i].want);
  }
  test_check(f16_to_f32(0x0001) == 0x1p-24f && f16_to_f32(0x83FF) == -1023 * 0x1p-24f,
             "f16: subnormals decode to m * 2^-24");
  test_check(
      isnan(f16_to_f32(f32_to_f16(NAN))) && isnan(f16_to_f32(f32_to_f16(float_of(0x7F800001)))),
      "f16: f32 NaN (also with a low payload) -> NaN");
  double worst = 0;
  for (int i = 0; i < 100000; i++) {
    // Normal half range: 2^-14 .. 65504.
    float x = expf(test_rng_uniform(rng, -9.7f, 11.09f)) * (test_rng_u64(rng) & 1 ? 1 : -1);
    double e = fabs((double)f16_to_f32(f32_to_f16(x)) - x) / fabs((double)x);
    if (!(e <= worst)) worst = e;
  }
  // 11 significant bits: half an ulp is 2^-11 relative.
  test_check(worst <= 0x1p-11, "f16: max rel err f32->f16->f32 %.3e (tol 2^-11 = %.3e)", worst,
             0x1p-11);
}

int main(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/test_safetensors.XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    printf("cannot create a temp directory under /tmp\n");
    return 1;
  }
  TestRng rng = {.state = 0x5AFE7E450125ull};
  test_round_trip(&rng);
  test_python_layout();
  test_malformed(&rng);
  test_checksum(&rng);
  test_mangled(&rng);
  test_atomic_save(&rng);
  test_bf16(&rng);
  test_f16(&rng);
  remove_tree(tmp_dir);
  return test_finish();
}
