/* Fake NVML: GPU interconnect topology, from the device keys of the configuration:
 *   nvlink=<peer>x<n>[+<peer>x<n>...]  direct NVLinks to other devices (config order),
 *   nvswitch=<n>                       NVLinks into an NVSwitch fabric shared by all such GPUs,
 *   pcie_switch=<id>, host_bridge=<id>, board=<id>, numa=<node>   the PCIe tree.
 * Links are numbered: the direct links in peer order first, then the NVSwitch links. */
#include "fake_nvml.h"

#include <string.h>

#define FG_NVSWITCH_BUS 0xf0 /* remote PCI bus of the fake NVSwitch chips */

static const fg_dev_cfg *gpu(nvmlDevice_t d, int *index)
{
    int i = fgn_physical(d);
    if (index)
        *index = i;
    return i < 0 ? NULL : &fg_cfg()->dev[i];
}

/* The peer of `link` on device `d`: a device index, or -2 for the NVSwitch; -1: no such link. */
static int link_peer(const fg_dev_cfg *d, unsigned link)
{
    unsigned n = 0;
    for (int j = 0; j < FG_MAX_DEV; j++) {
        n += (unsigned)d->nvlinks[j];
        if (link < n)
            return j;
    }
    return link < n + (unsigned)d->nvswitch_links ? -2 : -1;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    const fg_dev_cfg *d = gpu(device, NULL);
    if (!d || !active || link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (link_peer(d, link) == -1)
        return NVML_ERROR_NOT_SUPPORTED;
    *active = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *type)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    const fg_dev_cfg *d = gpu(device, NULL);
    if (!d || !type || link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    int peer = link_peer(d, link);
    if (peer == -1)
        return NVML_ERROR_NOT_SUPPORTED;
    *type = peer == -2 ? NVML_NVLINK_DEVICE_TYPE_SWITCH : NVML_NVLINK_DEVICE_TYPE_GPU;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    const fg_dev_cfg *d = gpu(device, NULL);
    if (!d || !pci || link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    int peer = link_peer(d, link);
    if (peer == -1)
        return NVML_ERROR_NOT_SUPPORTED;
    if (peer >= 0) {
        fgn_fill_pci(&fg_cfg()->dev[peer], pci);
        return NVML_SUCCESS;
    }
    /* an NVSwitch: one of six chips, links spread over them */
    fg_dev_cfg sw;
    memset(&sw, 0, sizeof sw);
    sw.bus = FG_NVSWITCH_BUS + link % 6;
    sw.pci_device_id = 0x22a310de;
    fgn_fill_pci(&sw, pci);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

static int host_bridge(const fg_dev_cfg *d)
{
    return d->host_bridge >= 0 ? d->host_bridge : 1000000 + d->numa;
}

static nvmlGpuTopologyLevel_t common_ancestor(const fg_dev_cfg *a, const fg_dev_cfg *b)
{
    if (a == b || (a->board >= 0 && a->board == b->board))
        return NVML_TOPOLOGY_INTERNAL;
    if (a->pcie_switch >= 0 && a->pcie_switch == b->pcie_switch)
        return NVML_TOPOLOGY_SINGLE;
    if (host_bridge(a) == host_bridge(b))
        return a->pcie_switch >= 0 && b->pcie_switch >= 0 ? NVML_TOPOLOGY_MULTIPLE : NVML_TOPOLOGY_HOSTBRIDGE;
    if (a->numa == b->numa)
        return NVML_TOPOLOGY_NODE;
    return NVML_TOPOLOGY_SYSTEM;
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2,
                                                        nvmlGpuTopologyLevel_t *level)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    const fg_dev_cfg *a = gpu(d1, NULL), *b = gpu(d2, NULL);
    if (!a || !b || !level)
        return NVML_ERROR_INVALID_ARGUMENT;
    *level = common_ancestor(a, b);
    return NVML_SUCCESS;
}

/* Whether a and b reach each other over NVLink (direct, or both on the NVSwitch fabric). */
static int nvlinked(const fg_dev_cfg *a, int ib, const fg_dev_cfg *b)
{
    (void)b;
    return a->nvlinks[ib] > 0 || (a->nvswitch_links > 0 && b->nvswitch_links > 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, nvmlGpuP2PCapsIndex_t index,
                                           nvmlGpuP2PStatus_t *status)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    int ia, ib;
    const fg_dev_cfg *a = gpu(d1, &ia), *b = gpu(d2, &ib);
    if (!a || !b || !status || index > NVML_P2P_CAPS_INDEX_UNKNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    (void)ia;
    int nv = nvlinked(a, ib, b);
    int pcie = common_ancestor(a, b) <= NVML_TOPOLOGY_HOSTBRIDGE;
    int ok;
    switch (index) {
    case NVML_P2P_CAPS_INDEX_NVLINK: ok = nv; break;
    case NVML_P2P_CAPS_INDEX_PCI: ok = pcie; break;
    case NVML_P2P_CAPS_INDEX_UNKNOWN: ok = 0; break;
    default: ok = nv || pcie; break;
    }
    *status = ok ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED;
    return NVML_SUCCESS;
}
