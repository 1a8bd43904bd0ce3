/* A small open-addressing hash map from a nonzero 64-bit key (a device pointer or a
 * handle) to a fixed record. Not thread-safe: callers hold their own lock.
 * Used by the fake driver (its allocation table) and by libvgpu (what it charged). */
#ifndef HAMI_PTRMAP_H
#define HAMI_PTRMAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t size;  /* bytes charged */
    uint64_t aux;   /* kind-specific (pool pointer, mapping handle, ...) */
    uint64_t owner; /* owning context, for allocations the driver frees with it */
    int32_t dev;
    int32_t kind;
} ptrmap_val;

typedef struct {
    uint64_t key; /* 0 = empty, 1 = tombstone */
    ptrmap_val val;
} ptrmap_slot;

typedef struct {
    ptrmap_slot *slots;
    size_t cap;   /* power of two */
    size_t used;  /* live + tombstones */
    size_t live;
} ptrmap;

#define PTRMAP_TOMB 1ULL

static inline size_t ptrmap_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k;
}

static inline int ptrmap_grow(ptrmap *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 1024;
    while (m->live * 2 >= ncap)
        ncap *= 2;
    ptrmap_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return -1;
    for (size_t i = 0; i < m->cap; i++) {
        uint64_t k = m->slots[i].key;
        if (k > PTRMAP_TOMB) {
            size_t j = ptrmap_hash(k) & (ncap - 1);
            while (ns[j].key)
                j = (j + 1) & (ncap - 1);
            ns[j] = m->slots[i];
        }
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    m->used = m->live;
    return 0;
}

static inline ptrmap_val *ptrmap_get(ptrmap *m, uint64_t key)
{
    if (!m->cap || key <= PTRMAP_TOMB)
        return NULL;
    size_t j = ptrmap_hash(key) & (m->cap - 1);
    while (m->slots[j].key) {
        if (m->slots[j].key == key)
            return &m->slots[j].val;
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

/* Insert or overwrite; returns 0 on success. */
static inline int ptrmap_put(ptrmap *m, uint64_t key, ptrmap_val v)
{
    if (key <= PTRMAP_TOMB)
        return -1;
    ptrmap_val *old = ptrmap_get(m, key);
    if (old) {
        *old = v;
        return 0;
    }
    if ((m->used + 1) * 10 >= m->cap * 7 && ptrmap_grow(m))
        return -1;
    size_t j = ptrmap_hash(key) & (m->cap - 1);
    while (m->slots[j].key > PTRMAP_TOMB)
        j = (j + 1) & (m->cap - 1);
    if (!m->slots[j].key)
        m->used++;
    m->slots[j].key = key;
    m->slots[j].val = v;
    m->live++;
    return 0;
}

/* Remove; copies the record to *out if found. Returns 1 if found. */
static inline int ptrmap_del(ptrmap *m, uint64_t key, ptrmap_val *out)
{
    if (!m->cap || key <= PTRMAP_TOMB)
        return 0;
    size_t j = ptrmap_hash(key) & (m->cap - 1);
    while (m->slots[j].key) {
        if (m->slots[j].key == key) {
            if (out)
                *out = m->slots[j].val;
            m->slots[j].key = PTRMAP_TOMB;
            m->live--;
            return 1;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return 0;
}

#endif
