// shards.c: the tar shard index, reads, and the per-rank epoch order (see shards.h).
//
// Tar (POSIX ustar, as Python's tarfile and GNU tar write it): 512-byte headers, each member's
// data padded to 512 bytes, two zero blocks at the end. Names come from the header (prefix/name),
// a preceding pax 'x' record's path=, or a GNU 'L' long-name member.
#define _POSIX_C_SOURCE 200809L  // pread, fseeko
#include "data/shards.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <unistd.h>

#include "src/base/rng.h"

#define TAR_BLOCK 512
#define NAME_BYTES 1024

static const char *HINT_SHARDS =
    "HINT: a shards split is <data.path>/<split>/*.tar, each holding NNNNNN.jpg + NNNNNN.cls "
    "pairs (scripts/make_shards.py writes them from an ImageFolder)";

// Growable arrays of the index.
typedef struct {
  int *shard, *label;
  int64_t *offset, *size;
  int64_t n, cap;
} Index;

static void index_push(Index *x, int shard, int64_t offset, int64_t size, int label) {
  if (x->n == x->cap) {
    x->cap = x->cap ? 2 * x->cap : 1024;
    int *s = malloc_check(sizeof(int) * (size_t)x->cap),
        *l = malloc_check(sizeof(int) * (size_t)x->cap);
    int64_t *o = malloc_check(sizeof(int64_t) * (size_t)x->cap);
    int64_t *z = malloc_check(sizeof(int64_t) * (size_t)x->cap);
    if (x->n) {
      memcpy(s, x->shard, sizeof(int) * (size_t)x->n);
      memcpy(l, x->label, sizeof(int) * (size_t)x->n);
      memcpy(o, x->offset, sizeof(int64_t) * (size_t)x->n);
      memcpy(z, x->size, sizeof(int64_t) * (size_t)x->n);
    }
    free(x->shard), free(x->label), free(x->offset), free(x->size);
    x->shard = s, x->label = l, x->offset = o, x->size = z;
  }
  x->shard[x->n] = shard;
  x->offset[x->n] = offset;
  x->size[x->n] = size;
  x->label[x->n++] = label;
}

// An octal header field (NUL or space terminated); -1 when malformed.
static int64_t octal_field(const unsigned char *p, int len) {
  int64_t v = 0;
  int i = 0;
  while (i < len && p[i] == ' ') i++;
  if (i == len || p[i] < '0' || p[i] > '7') return -1;
  for (; i < len && p[i] >= '0' && p[i] <= '7'; i++) v = v * 8 + (p[i] - '0');
  return v;
}

static bool header_checksum_ok(const unsigned char *h) {
  int64_t want = octal_field(h + 148, 8), sum = 0;
  for (int i = 0; i < TAR_BLOCK; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return want == sum;
}

static bool all_zero(const unsigned char *h) {
  for (int i = 0; i < TAR_BLOCK; i++)
    if (h[i]) return false;
  return true;
}

// The key (path up to the first dot of the file name) and extension (after it) of a member.
static void split_name(const char *name, char *key, const char **ext) {
  const char *base = strrchr(name, '/');
  base = base ? base + 1 : name;
  const char *dot = strchr(base, '.');
  size_t key_len = dot ? (size_t)(dot - name) : strlen(name);
  memcpy(key, name, key_len);
  key[key_len] = 0;
  *ext = dot ? dot + 1 : "";
}

static bool is_image_ext(const char *ext) {
  return strcasecmp(ext, "jpg") == 0 || strcasecmp(ext, "jpeg") == 0 || strcasecmp(ext, "png") == 0;
}

// One sample being assembled from consecutive members with the same key.
typedef struct {
  char key[NAME_BYTES];
  int64_t offset, size;  // image; size -1 = none yet
  int label;             // -1 = none yet
} Pending;

static int flush_pending(Pending *p, Index *x, int shard, const char *path, Error *err) {
  if (!p->key[0]) return 0;
  if (p->size < 0 || p->label < 0)
    return error_set(err, "shard '%s': sample '%s' has %s but no %s\n%s", path, p->key,
                     p->size < 0 ? "a .cls" : "an image",
                     p->size < 0 ? "image (.jpg/.jpeg/.png)" : ".cls", HINT_SHARDS);
  index_push(x, shard, p->offset, p->size, p->label);
  p->key[0] = 0;
  return 0;
}

// The pax record "path=" of an extended header's data, if any.
static void pax_path(const char *data, int64_t size, char *out) {
  for (int64_t i = 0; i < size;) {
    char *end;
    long len = strtol(data + i, &end, 10);
    if (len <= 0 || i + len > size) return;
    const char *kv = end + 1;
    if (strncmp(kv, "path=", 5) == 0) {
      int64_t n = (data + i + len - 1) - (kv + 5);  // without the trailing newline
      if (n > 0 && n < NAME_BYTES) {
        memcpy(out, kv + 5, (size_t)n);
        out[n] = 0;
      }
    }
    i += len;
  }
}

static int scan_tar(const char *path, int shard, Index *x, Error *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return error_set(err, "cannot open shard '%s': %s", path, strerror(errno));
  unsigned char h[TAR_BLOCK];
  char long_name[NAME_BYTES] = "", name[NAME_BYTES], key[NAME_BYTES];
  Pending p = {.key = "", .size = -1, .label = -1};
  int64_t pos = 0;
  int rc = 0;
  for (;;) {
    size_t got = fread(h, 1, TAR_BLOCK, f);
    if (got == 0) break;  // a tar without end blocks still ends here
    if (got != TAR_BLOCK) {
      rc = error_set(err, "shard '%s': truncated header at byte %lld\n%s", path, (long long)pos,
                     HINT_SHARDS);
      break;
    }
    if (all_zero(h)) break;
    int64_t size = octal_field(h + 124, 12);
    if (!header_checksum_ok(h) || size < 0) {
      rc = error_set(err, "shard '%s': corrupt tar header at byte %lld (bad checksum or size)\n%s",
                     path, (long long)pos, HINT_SHARDS);
      break;
    }
    int64_t data = pos + TAR_BLOCK, padded = (size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    char type = (char)h[156];
    if (type == 'L' || type == 'x') {
      char *buf = malloc_check((size_t)size + 1);
      if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        rc = error_set(err, "shard '%s': truncated member at byte %lld\n%s", path, (long long)data,
                       HINT_SHARDS);
        break;
      }
      buf[size] = 0;
      if (type == 'L')
        snprintf(long_name, sizeof long_name, "%s", buf);
      else
        pax_path(buf, size, long_name);
      free(buf);
    } else if (type == '0' || type == '\0') {
      if (long_name[0]) {
        snprintf(name, sizeof name, "%s", long_name);
      } else if (memcmp(h + 257, "ustar", 5) == 0 && h[345]) {
        snprintf(name, sizeof name, "%.155s/%.100s", (const char *)h + 345, (const char *)h);
      } else {
        snprintf(name, sizeof name, "%.100s", (const char *)h);
      }
      long_name[0] = 0;
      const char *ext;
      split_name(name, key, &ext);
      if (strcmp(key, p.key) != 0) {
        if ((rc = flush_pending(&p, x, shard, path, err)) != 0) break;
        snprintf(p.key, sizeof p.key, "%s", key);
        p.size = -1;
        p.label = -1;
      }
      if (is_image_ext(ext)) {
        p.offset = data;
        p.size = size;
      } else if (strcmp(ext, "cls") == 0) {
        char text[32] = {0};
        if (size < 1 || size >= (int64_t)sizeof text ||
            fread(text, 1, (size_t)size, f) != (size_t)size) {
          rc = error_set(err, "shard '%s': member '%s' is not a class index (%lld bytes)\n%s", path,
                         name, (long long)size, HINT_SHARDS);
          break;
        }
        char *end;
        long v = strtol(text, &end, 10);
        while (*end == '\n' || *end == '\r' || *end == ' ') end++;
        if (end == text || *end || v < 0 || v > 1 << 24) {
          rc = error_set(err, "shard '%s': member '%s' holds '%.31s', not a class index >= 0\n%s",
                         path, name, text, HINT_SHARDS);
          break;
        }
        p.label = (int)v;
      }
      // Other members of a sample (.json, .txt, ...) are ignored.
    }
    pos = data + padded;
    if (fseeko(f, pos, SEEK_SET) != 0) {
      rc = error_set(err, "shard '%s': cannot seek to byte %lld\n%s", path, (long long)pos,
                     HINT_SHARDS);
      break;
    }
  }
  if (rc == 0) rc = flush_pending(&p, x, shard, path, err);
  fclose(f);
  return rc;
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// dir/*.tar, sorted; returns the count (0 when none) or -1 with err.
static int list_tars(const char *dir, char ***out, Error *err) {
  DIR *d = opendir(dir);
  if (!d)
    return error_set(err, "cannot list shard directory '%s': %s\n%s", dir, strerror(errno),
                     HINT_SHARDS);
  int count = 0, cap = 16;
  char **names = malloc_check(sizeof(char *) * (size_t)cap);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (e->d_name[0] == '.' || len < 5 || strcmp(e->d_name + len - 4, ".tar") != 0) continue;
    if (count == cap) {
      cap *= 2;
      char **grown = malloc_check(sizeof(char *) * (size_t)cap);
      memcpy(grown, names, sizeof(char *) * (size_t)count);
      free(names);
      names = grown;
    }
    size_t bytes = strlen(dir) + len + 2;
    names[count] = malloc_check(bytes);
    snprintf(names[count++], bytes, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)count, sizeof(char *), compare_strings);
  *out = names;
  return count;
}

int shards_open(ShardSet *s, const char *dir, Error *err) {
  memset(s, 0, sizeof *s);
  int count = list_tars(dir, &s->paths, err);
  if (count < 0) return -1;
  s->num_shards = count;
  if (count == 0)
    return error_set(err, "shard directory '%s' has no .tar files\n%s", dir, HINT_SHARDS);
  s->fds = malloc_check(sizeof(int) * (size_t)count);
  s->first = malloc_check(sizeof(int64_t) * (size_t)count);
  s->count = malloc_check(sizeof(int64_t) * (size_t)count);
  for (int i = 0; i < count; i++) s->fds[i] = -1;
  Index x = {0};
  for (int i = 0; i < count; i++) {
    s->first[i] = x.n;
    if (scan_tar(s->paths[i], i, &x, err) != 0) {
      s->shard = x.shard, s->label = x.label, s->offset = x.offset, s->size = x.size;
      return -1;
    }
    s->count[i] = x.n - s->first[i];
    s->fds[i] = open(s->paths[i], O_RDONLY);
    if (s->fds[i] < 0) {
      s->shard = x.shard, s->label = x.label, s->offset = x.offset, s->size = x.size;
      return error_set(err, "cannot open shard '%s': %s", s->paths[i], strerror(errno));
    }
  }
  s->shard = x.shard, s->label = x.label, s->offset = x.offset, s->size = x.size;
  s->n = x.n;
  s->max_label = -1;
  for (int64_t i = 0; i < s->n; i++)
    if (s->label[i] > s->max_label) s->max_label = s->label[i];
  return 0;
}

void shards_close(ShardSet *s) {
  for (int i = 0; i < s->num_shards; i++) {
    if (s->fds && s->fds[i] >= 0) close(s->fds[i]);
    if (s->paths) free(s->paths[i]);
  }
  free(s->paths), free(s->fds), free(s->first), free(s->count);
  free(s->shard), free(s->label), free(s->offset), free(s->size);
  memset(s, 0, sizeof *s);
}

void shards_limit(ShardSet *s, int64_t limit) {
  if (limit <= 0 || limit >= s->n) return;
  s->n = limit;
  for (int i = 0; i < s->num_shards; i++) {
    int64_t end = s->first[i] + s->count[i];
    if (s->first[i] >= limit)
      s->first[i] = limit, s->count[i] = 0;
    else if (end > limit)
      s->count[i] = limit - s->first[i];
  }
}

uint8_t *shards_read(const ShardSet *s, int64_t i, size_t *size, Error *err) {
  int shard = s->shard[i];
  size_t n = (size_t)s->size[i];
  uint8_t *buf = malloc_check(n ? n : 1);
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(s->fds[shard], buf + done, n - done, (off_t)(s->offset[i] + (int64_t)done));
    if (r <= 0) {
      error_set(err, "shard '%s': cannot read sample %lld (%zu bytes at %lld): %s", s->paths[shard],
                (long long)i, n, (long long)s->offset[i],
                r == 0 ? "unexpected end of file" : strerror(errno));
      free(buf);
      return NULL;
    }
    done += (size_t)r;
  }
  *size = n;
  return buf;
}

int64_t shards_rank_samples(const ShardSet *s, int rank, int world) {
  int64_t n = 0;
  for (int i = rank; i < s->num_shards; i += world) n += s->count[i];
  return n;
}

void shards_epoch_order(const ShardSet *s, uint64_t seed, int64_t epoch, int rank, int world,
                        int64_t buffer, int64_t *order) {
  Rng rng = rng_make(seed, RNG_STREAM_SHARDS, (uint64_t)epoch, (uint64_t)rank);
  int mine = 0;
  for (int i = rank; i < s->num_shards; i += world) mine++;
  int *visit = malloc_check(sizeof(int) * (size_t)(mine > 0 ? mine : 1));
  for (int k = 0, i = rank; i < s->num_shards; i += world) visit[k++] = i;
  for (int k = mine - 1; k > 0; k--) {
    int j = (int)rng_below(&rng, (uint32_t)(k + 1)), t = visit[k];
    visit[k] = visit[j];
    visit[j] = t;
  }
  if (buffer < 1) buffer = 1;
  int64_t *held = malloc_check(sizeof(int64_t) * (size_t)buffer);
  int64_t count = 0, out = 0;
  // WebDataset's shuffle: fill the buffer, then each new sample replaces a random held one,
  // which is emitted; at the end the rest leaves in random order.
  for (int k = 0; k < mine; k++) {
    for (int64_t i = s->first[visit[k]]; i < s->first[visit[k]] + s->count[visit[k]]; i++) {
      if (count < buffer) {
        held[count++] = i;
        continue;
      }
      uint32_t j = rng_below(&rng, (uint32_t)buffer);
      order[out++] = held[j];
      held[j] = i;
    }
  }
  while (count > 0) {
    uint32_t j = rng_below(&rng, (uint32_t)count);
    order[out++] = held[j];
    held[j] = held[--count];
  }
  free(held);
  free(visit);
}
