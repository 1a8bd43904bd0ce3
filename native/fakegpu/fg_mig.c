/* The MIG geometry of the products the fake driver models, and MIG device UUIDs: shared by
 * the fake NVML (fake_nvml_mig.c) and by the container-runtime view of fg_state.c. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include "fg.h"

#include <stdio.h>
#include <string.h>

#define P(idx, ...) [idx] = {1, __VA_ARGS__}
/* Indices are NVML_GPU_INSTANCE_PROFILE_*; figures follow the products' published MIG tables. */
static const fg_mig_profile A100_40GB[FG_MIG_PROFILES] = {
    P(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.5gb", 7, 1, 14, 4864, 1, 7, {0, 1, 2, 3, 4, 5, 6}),
    P(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 14, 4864, 1, 7, {0, 1, 2, 3, 4, 5, 6}),
    P(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.10gb", 4, 1, 14, 9856, 2, 4, {0, 2, 4, 6}),
    P(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.10gb", 3, 2, 28, 9856, 2, 3, {0, 2, 4}),
    P(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.20gb", 2, 3, 42, 19968, 4, 2, {0, 4}),
    P(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.20gb", 1, 4, 56, 19968, 4, 1, {0}),
    P(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.40gb", 1, 7, 98, 40192, 8, 1, {0}),
};
static const fg_mig_profile H100_80GB[FG_MIG_PROFILES] = {
    P(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 7, 1, 16, 9856, 1, 7, {0, 1, 2, 3, 4, 5, 6}),
    P(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 16, 9856, 1, 7, {0, 1, 2, 3, 4, 5, 6}),
    P(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 4, 1, 26, 19968, 2, 4, {0, 2, 4, 6}),
    P(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 3, 2, 32, 19968, 2, 3, {0, 2, 4}),
    P(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 2, 3, 60, 40320, 4, 2, {0, 4}),
    P(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 1, 4, 64, 40320, 4, 1, {0}),
    P(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 1, 7, 132, 80768, 8, 1, {0}),
};
#undef P


const fg_mig_profile *fg_mig_geometry(int geometry)
{
    switch (geometry) {
    case FG_MIG_A100_40GB: return A100_40GB;
    case FG_MIG_H100_80GB: return H100_80GB;
    default: return NULL;
    }
}

void fg_mig_uuid(const unsigned char gpu_uuid[16], int id, unsigned long long gen, char *out, unsigned long len)
{
    unsigned char b[16];
    memcpy(b, gpu_uuid, 16);
    b[0] ^= 0x4d;
    b[12] ^= (unsigned char)id;
    b[13] ^= (unsigned char)(gen >> 16);
    b[14] ^= (unsigned char)(gen >> 8);
    b[15] ^= (unsigned char)gen;
    snprintf(out, len, "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}
