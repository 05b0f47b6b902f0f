//! What [`SimState`] tells of each simulated GPU: memory, name, UUID, serial, PCI location.

use crate::*;

impl SimState {
    /// Physical memory of device `i`.
    pub fn device_total(&self, i: usize) -> u64 {
        self.dev(i).total
    }
    /// Memory of device `i` processes can use: total less the driver's reservation.
    pub fn device_usable(&self, i: usize) -> u64 {
        self.device_total(i).saturating_sub(self.driver_reserved())
    }
    /// Name of device `i`.
    pub fn device_name(&self, i: usize) -> String {
        read_str(&self.dev(i).name)
    }
    /// What the GPUs' UUIDs derive from (`FGPU_SIM_UUID_SEED`, or drawn at creation).
    pub fn uuid_seed(&self) -> u64 {
        self.header().uuid_seed
    }
    /// The 16 UUID bytes of device `i` (what `cuDeviceGetUuid` returns).
    pub fn device_uuid(&self, i: usize) -> [u8; 16] {
        self.dev(i).uuid
    }
    /// `GPU-…` UUID string of device `i` (what `nvmlDeviceGetUUID` returns).
    pub fn device_uuid_string(&self, i: usize) -> String {
        format_gpu_uuid(&self.dev(i).uuid)
    }
    /// Board serial number of device `i`.
    pub fn device_serial(&self, i: usize) -> String {
        read_str(&self.dev(i).serial)
    }
    /// PCI location of device `i`.
    pub fn device_pci(&self, i: usize) -> PciLocation {
        let d = self.dev(i);
        PciLocation { domain: d.pci_domain, bus: d.pci_bus, device: d.pci_device, pci_device_id: d.pci_device_id, pci_subsystem_id: d.pci_subsystem_id }
    }
    /// Device minor number (`/dev/nvidiaN`).
    pub fn device_minor(&self, i: usize) -> u32 {
        self.dev(i).minor_number
    }

    /// The device's used-bytes counter: every process's usage, including processes that
    /// died and were not reclaimed yet. Allocation compares against this.
    pub fn device_used_counter(&self, i: usize) -> u64 {
        self.dev(i).used.load(Ordering::Acquire)
    }

    /// How long a dead process's memory stays held (`FGPU_SIM_EXIT_FREE_DELAY`), ns.
    pub fn exit_free_delay_ns(&self) -> u64 {
        self.header().exit_free_delay_ns
    }
}
