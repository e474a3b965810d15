// shards.h: WebDataset-style tar shards (dataset.c's data.dataset = shards).
//
// A split is a directory of *.tar files (sorted by name). Each tar holds samples as consecutive
// members sharing a key: NNNNNN.jpg (or .jpeg / .png) with the image and NNNNNN.cls with the class
// index as decimal text; the key is the member's path up to the first dot of its file name.
// Opening a split scans the tar headers (seeking over image data, reading the small .cls
// members) into an index of (shard, offset, size, label); images are read later with pread, so
// many loader threads can read one open file.
//
// Training reads the shards as streams: rank r of a world of w owns the shards r, r + w, ...
// (fixed, so every epoch has the same number of samples per rank), visits them in an order
// shuffled per epoch, and passes their samples through a shuffle buffer of `buffer` samples:
// emission stays within `buffer` samples of the read position, so a node reads a few large files
// nearly sequentially. All draws come from (seed, RNG_STREAM_SHARDS, epoch, rank).
#pragma once
#include <stdint.h>

#include "src/base/util.h"

typedef struct {
  int num_shards;
  char **paths;            // (num_shards) tar files
  int *fds;                // (num_shards) open for pread
  int64_t *first, *count;  // (num_shards) each shard's samples: [first, first + count)
  int64_t n;               // samples
  int *shard;              // (n) which tar
  int64_t *offset, *size;  // (n) image bytes inside it
  int *label;              // (n)
  int max_label;
} ShardSet;

// Scans dir/*.tar. Errors name the tar file and member (a truncated or corrupt header, an image
// without .cls or the reverse, a .cls that is not a non-negative integer) and hint at the fix.
int shards_open(ShardSet *s, const char *dir, Error *err);
void shards_close(ShardSet *s);
// Keeps only the first `limit` samples in shard order.
void shards_limit(ShardSet *s, int64_t limit);
// Reads sample i's image bytes into a malloc'ed buffer.
uint8_t *shards_read(const ShardSet *s, int64_t i, size_t *size, Error *err);
// Samples of the shards rank owns in a world of `world`.
int64_t shards_rank_samples(const ShardSet *s, int rank, int world);
// rank's sample order for epoch (dataset indices into order, shards_rank_samples of them).
void shards_epoch_order(const ShardSet *s, uint64_t seed, int64_t epoch, int rank, int world,
                        int64_t buffer, int64_t *order);
