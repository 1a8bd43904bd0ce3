/* Internals shared by the fake NVML's translation units (fake_nvml.c: devices, memory,
 * processes, events; fake_nvml_topo.c: NVLink/PCIe topology; fake_nvml_mig.c: MIG). */
#ifndef FAKEGPU_FAKE_NVML_H
#define FAKEGPU_FAKE_NVML_H

#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include "fg.h"

#define EXPORT __attribute__((visibility("default")))

/* A physical GPU handle (g_dev[index]) or a MIG device handle (mig_gi > 0). */
struct nvmlDevice_st {
    int index;  /* physical device */
    int mig_gi; /* 0: the GPU itself; else the GPU instance id of this MIG device */
};

FG_HIDDEN int fgn_inited(void);
FG_HIDDEN int fgn_physical(nvmlDevice_t d); /* physical index of a GPU handle, -1 if not one */
FG_HIDDEN nvmlDevice_t fgn_handle(int physical);

FG_HIDDEN void fgn_fill_pci(const fg_dev_cfg *d, nvmlPciInfo_t *pci);

FG_HIDDEN int fgn_is_mig(nvmlDevice_t d);
FG_HIDDEN nvmlReturn_t fgn_mig_uuid(nvmlDevice_t d, char *out, unsigned len);
FG_HIDDEN nvmlReturn_t fgn_mig_name(nvmlDevice_t d, char *out, unsigned len);
FG_HIDDEN nvmlReturn_t fgn_mig_memory(nvmlDevice_t d, unsigned long long *total);

#endif
