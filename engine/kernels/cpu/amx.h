/* What every AMX kernel of this folder needs: the tile state from Linux, and the one tile
   shape they all use. Include only under defined(__AMX_TILE__) (and _GNU_SOURCE set first,
   for syscall()). */

#ifndef DSPARK_CPU_AMX_H
#define DSPARK_CPU_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* 0 when this process may use the tile registers (Linux grants them per process, on request). */
static inline int amx_request_tiles(void) {
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

/* This thread's tiles 0-7 as 16 rows of 64 bytes each (a tile of 16 x 32 bf16 or 16 x 16 fp32). */
static inline void amx_configure_tiles(void) {
    struct {
        uint8_t palette_id, start_row, reserved[14];
        uint16_t bytes_per_row[16];
        uint8_t rows[16];
    } config;
    memset(&config, 0, sizeof(config));
    config.palette_id = 1;
    for (int tile = 0; tile < 8; tile++) {
        config.rows[tile] = 16;
        config.bytes_per_row[tile] = 64;
    }
    _tile_loadconfig(&config);
}

/* 16 lanes of bf16 -> fp32. */
static inline __m512 bf16x16_to_float(__m256i values) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(values), 16));
}

#endif
