// fuzz_safetensors.c: the safetensors reader (src/io/safetensors.c) on arbitrary bytes, and the
// writer on whatever the reader accepts: a file that parses must describe tensors inside its
// data section, and writing its tensors and metadata back must give a file that reads back
// with the same names, dtypes, shapes, bytes and metadata.
#define _XOPEN_SOURCE 700  // tests/fuzz/fuzz.h: mkdtemp, nftw
#include "src/io/safetensors.h"
#include "tests/fuzz/fuzz.h"

// Reads every byte of every tensor, so that a range outside the buffer is caught by ASan.
static unsigned touch_all(const SafeTensors *st) {
  unsigned sum = 0;
  for (int i = 0; i < st->count; i++) {
    const SafeTensorEntry *e = &st->entries[i];
    FUZZ_REQUIRE(e->begin <= e->end && e->end <= st->data_size,
                 "tensor '%s' [%llu, %llu) outside the %zu-byte data section", e->name,
                 (unsigned long long)e->begin, (unsigned long long)e->end, st->data_size);
    FUZZ_REQUIRE(safetensors_find(st, e->name) == e, "safetensors_find misses '%s'", e->name);
    const unsigned char *p = safetensors_entry_data(st, e);
    for (uint64_t k = 0; k < e->end - e->begin; k++) sum += p[k];
  }
  return sum;
}

static void check_rewrite(const SafeTensors *st) {
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  for (int i = 0; i < st->meta_count; i++)
    if (strcmp(st->meta[i].key, "swin.checksum") != 0)  // save computes its own
      safetensors_writer_meta(&w, st->meta[i].key, st->meta[i].value);
  for (int i = 0; i < st->count; i++) {
    const SafeTensorEntry *e = &st->entries[i];
    safetensors_writer_add(&w, e->name, e->dtype, e->ndim, e->shape, safetensors_entry_data(st, e));
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/rewrite.safetensors", fuzz_scratch());
  Error err;
  FUZZ_REQUIRE(safetensors_writer_save(&w, path, &err) == 0,
               "the writer refuses what the reader accepted: %s", err.msg);
  safetensors_writer_free(&w);
  SafeTensors back;
  FUZZ_REQUIRE(safetensors_read(&back, path, &err) == 0, "a written file does not read: %s",
               err.msg);
  FUZZ_REQUIRE(back.count == st->count && back.has_checksum, "tensor count %d -> %d", st->count,
               back.count);
  for (int i = 0; i < st->count; i++) {
    const SafeTensorEntry *e = &st->entries[i], *f = safetensors_find(&back, e->name);
    FUZZ_REQUIRE(f && f->dtype == e->dtype && f->ndim == e->ndim &&
                     memcmp(f->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim) == 0 &&
                     f->end - f->begin == e->end - e->begin &&
                     memcmp(safetensors_entry_data(&back, f), safetensors_entry_data(st, e),
                            e->end - e->begin) == 0,
                 "tensor '%s' changed over a rewrite", e->name);
  }
  for (int i = 0; i < st->meta_count; i++) {
    const char *v = safetensors_meta_get(&back, st->meta[i].key);
    FUZZ_REQUIRE(
        strcmp(st->meta[i].key, "swin.checksum") == 0 || (v && strcmp(v, st->meta[i].value) == 0),
        "metadata '%s' changed over a rewrite", st->meta[i].key);
  }
  safetensors_free(&back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  SafeTensors st;
  Error err;
  if (safetensors_parse(&st, data, size, "fuzz input", &err) != 0) {
    FUZZ_REQUIRE(st.count == 0 && st.file == NULL, "a failed parse left state behind");
    return 0;
  }
  volatile unsigned sum = touch_all(&st);
  (void)sum;
  check_rewrite(&st);
  safetensors_free(&st);
  return 0;
}
