// config_keys.h: what config.c exports from its key table beyond config.h, for the key
// reference (configs/README.md) and `swin_train --keys`.
#pragma once
#include <stdio.h>

#include "src/base/config.h"

// Prints every key as a Markdown table (key | default | meaning), in table order; the meaning
// is the key's documentation followed by the values it accepts.
void config_print_reference(FILE *out);
