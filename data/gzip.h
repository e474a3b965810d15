// gzip.h: inflating a gzip file held in memory (RFC 1952, a single member), for Fashion-MNIST's
// .gz IDX files (data/fashion_mnist.c).
//
// The deflate data is inflated with stb_image's zlib decoder (data/image.c compiles it), so the
// project needs no zlib; the header's optional CRC (FHCRC, a CRC-32's low 16 bits) and the
// trailer's CRC-32 and size are checked here.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

// Whether buf (size bytes) starts with gzip's magic bytes 1f 8b.
bool gzip_detect(const uint8_t *buf, size_t size);

// Inflates the single-member gzip file held in buf (size bytes); returns a malloc'ed buffer of
// *out_size bytes, or NULL with err naming path (a damaged, truncated or multi-member file, a
// method other than deflate, or one over INT_MAX bytes, stb's limit).
uint8_t *gzip_inflate(const uint8_t *buf, size_t size, const char *path, size_t *out_size,
                      Error *err);
