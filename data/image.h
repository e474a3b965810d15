// image.h: decoding the image files of ImageFolder and shard datasets: JPEG and PNG, through
// stb_image, behind checks that keep damaged or hostile files away from what the decoder
// mishandles (see image.c).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Larger images are refused before decoding: a corrupt or hostile header could otherwise ask
// for gigabytes (64 Mpixel RGBA is 256 MB, far beyond any training image).
#define IMAGE_MAX_PIXELS ((int64_t)1 << 26)

// Decodes a JPEG or PNG file held in memory (size bytes) to (*h, *w, chans) uint8 pixels,
// converting gray, gray+alpha, RGB or RGBA to chans (1..4); free the result with image_free.
// Returns NULL with the reason in why (why_size bytes) when the file is not a JPEG or PNG,
// is damaged, or is larger than IMAGE_MAX_PIXELS.
uint8_t *image_decode(const uint8_t *file, size_t size, int chans, int *h, int *w, char *why,
                      size_t why_size);
void image_free(uint8_t *pixels);

// The checks image_decode makes before it decodes, alone: 0 with the size in (*h, *w) and
// whether the file is a JPEG, or -1 with the reason image_decode would give. The GPU decoder
// (data/jpeg_gpu.h) takes only files that pass, so a damaged file meets stb and its messages.
int image_check(const uint8_t *file, size_t size, int *h, int *w, bool *jpeg, char *why,
                size_t why_size);
