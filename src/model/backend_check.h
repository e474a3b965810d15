// backend_check.h: the checking layer at the backend's op boundary. Ops take raw pointers and
// shape integers (src/model/backend.h); this layer checks, at every call of a model op, that the
// memory the op will touch is the tensor it was planned for. backend_create installs it in front
// of the backend's own table, so every backend gets it and it is always on: be->ops is its table,
// whose model ops check their pointers and then call the backend's own op with the same
// arguments (the memory, graph and profiling entries and the size queries, attention_saved_floats
// and mlp_hidden_elements, are the backend's own).
//
// What is checked: the owners of backend memory register it as regions (Tensors: name, dtype,
// shape, data). Each wrapper computes from the op's own shape arguments the extent of every
// pointer the op touches (elements x the dtype backend.h gives it: act tensors in be->act, the
// rest f32, index i32, structs in backend memory as U8 bytes). A pointer inside a registered
// region must have its whole extent inside that same region, at a whole element of it, and the
// region must have the dtype the op expects; otherwise the process aborts with a message naming
// the op, the argument, the extent and the region (tensor_describe): a violation is a planning
// bug, not a user error. A pointer in no region is memory the caller owns and did not register
// (the batch staging, a test's buffers): it passes unchecked, and is counted per op. A NULL
// passes too, except an MLP op's hidden where the backend's mlp_hidden_elements is not 0: there
// the op stores GELU(pre), and the NULL aborts as a violation.
//
// Two kinds of region, which do not overlap within their kind:
//   - tensors: one planned buffer each (an activation, a parameter, its gradient);
//   - buffers: a flat allocation that holds tensors (the master weights, the gradients) or is
//     only ever passed whole (AdamW's moments). An op argument that takes a whole buffer (the
//     optimizer's, to_compute's) is checked against the buffer; any other argument is checked
//     against the tensor it points into, and fails if it points into a buffer outside every
//     tensor of it (an alignment gap, a moment).
// The cost is a binary search per pointer per op call, small next to any op; under CUDA graphs
// ops run on the host only at capture, so replays cost nothing. Counters are not thread-safe:
// a backend's ops are called from one thread.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "src/base/tensor.h"
#include "src/model/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Registers t (t->data: backend memory, tensor_bytes(t) of it) as a tensor region / a buffer
// region. A region of 0 bytes is ignored. Aborts when t overlaps a region of the same kind
// already registered (two planned tensors sharing memory is itself a planning bug). No-op on a
// backend without the checking layer (one not made by backend_create).
void backend_check_register(Backend *be, const Tensor *t);
void backend_check_register_buffer(Backend *be, const Tensor *t);
// Forgets the region that begins at base (a buffer when both kinds begin there) and every region
// inside it: the owner calls it with each allocation it registered, before it releases the
// memory, which may then be handed out again for something else. No region there: nothing.
void backend_check_unregister(Backend *be, const void *base);

// Per model op since the backend was created (or the counts were reset): calls, pointer
// arguments checked against a region, and pointer arguments in no region (NULL pointers and
// arguments the call does not touch are neither).
typedef struct {
  int64_t calls, checked, unchecked;
} BackendCheckCounts;

// The checked ops, by the name of their BackendOps field ("linear_forward"): i < count.
int backend_check_op_count(void);
const char *backend_check_op_name(int i);
// The counts of op `name`: 0, or -1 for a name that is not a checked op.
int backend_check_counts(const Backend *be, const char *name, BackendCheckCounts *counts);
void backend_check_reset_counts(Backend *be);
// Regions registered now, of both kinds (what an owner registers, it unregisters).
int backend_check_region_count(const Backend *be);
// The backend's own table, the one the checking layer calls.
const BackendOps *backend_check_inner(const Backend *be);

// backend_create's and backend_destroy's: put the layer in front of be->ops, and take it away
// again (be->ops is the backend's own table after backend_check_remove).
void backend_check_install(Backend *be);
void backend_check_remove(Backend *be);

#ifdef __cplusplus
}
#endif
