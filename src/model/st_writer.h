/*
 * st_writer: writes a .safetensors file tensor by tensor without holding it in memory.
 * Tensors are declared first (name, dtype, shape, a fill callback); st_writer_write()
 * then writes the header and streams each tensor's bytes from its callback in chunks.
 */
#ifndef PAGODA_MODEL_ST_WRITER_H
#define PAGODA_MODEL_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/safetensors.h"

/* Fills buf with bytes [off, off + n) of the tensor. */
typedef void (*st_fill_fn)(void *ctx, uint8_t *buf, size_t off, size_t n);

struct st_writer;

struct st_writer *st_writer_create(void);
void st_writer_add(struct st_writer *w, const char *name, enum st_dtype dt, int ndim,
                   const int64_t *shape, st_fill_fn fill, void *ctx);
/** Writes the file; metadata_format ("pt", "mlx" or NULL) goes into __metadata__. */
int st_writer_write(struct st_writer *w, const char *path, const char *metadata_format,
                    struct err *e);
void st_writer_destroy(struct st_writer *w);

#endif
