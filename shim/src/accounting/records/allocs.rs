//! Live allocations by device pointer: what `cuMemFree` must give back.
//!
//! On every allocation's and free's path, so the common case takes no lock: an
//! open-addressing table of atomics where an insert claims a slot with one compare-and-swap
//! and a remove releases it with another. Keys never return to "empty" (a removed entry
//! becomes a tombstone that later inserts reuse), so a lookup may stop at the first empty
//! slot. Probing is bounded; an allocation that finds no free slot within the bound, and
//! any lookup that misses, falls back to sharded, locked hash maps.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// One live allocation made through a counted call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alloc {
    pub ordinal: i32,
    pub bytes: u64,
}

const EMPTY: u64 = 0;
const TOMBSTONE: u64 = 1;
const TABLE_SLOTS: usize = 1 << 16;
const MAX_PROBE: usize = 32;
/// Bytes and ordinal share one word: 56 bits of size (64 PiB), 8 of ordinal.
const BYTES_MASK: u64 = (1 << 56) - 1;

struct Entry {
    key: AtomicU64,
    value: AtomicU64,
}

pub struct AllocMap {
    table: Box<[Entry]>,
    overflow: [Mutex<HashMap<u64, Alloc, BuildHasherDefault<PointerHasher>>>; 16],
}

impl Default for AllocMap {
    fn default() -> Self {
        let table = (0..TABLE_SLOTS).map(|_| Entry { key: AtomicU64::new(EMPTY), value: AtomicU64::new(0) }).collect();
        AllocMap { table, overflow: std::array::from_fn(|_| Mutex::new(HashMap::default())) }
    }
}

fn mix(ptr: u64) -> u64 {
    let h = ptr.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

fn pack(alloc: Alloc) -> Option<u64> {
    let ordinal = u8::try_from(alloc.ordinal).ok()? as u64;
    (alloc.bytes <= BYTES_MASK).then_some(ordinal << 56 | alloc.bytes)
}

fn unpack(value: u64) -> Alloc {
    Alloc { ordinal: (value >> 56) as i32, bytes: value & BYTES_MASK }
}

impl AllocMap {
    fn overflow(&self, ptr: u64) -> &Mutex<HashMap<u64, Alloc, BuildHasherDefault<PointerHasher>>> {
        &self.overflow[(mix(ptr) >> 60) as usize]
    }

    pub fn insert(&self, ptr: u64, alloc: Alloc) {
        if ptr > TOMBSTONE {
            if let Some(value) = pack(alloc) {
                let start = mix(ptr) as usize;
                for i in 0..MAX_PROBE {
                    let entry = &self.table[(start + i) & (TABLE_SLOTS - 1)];
                    let key = entry.key.load(Relaxed);
                    if (key == EMPTY || key == TOMBSTONE) && entry.key.compare_exchange(key, ptr, Acquire, Relaxed).is_ok() {
                        // Nobody looks this pointer up before the allocation call returns it,
                        // so publishing the value after the key is safe.
                        entry.value.store(value, Release);
                        return;
                    }
                }
            }
        }
        self.overflow(ptr).lock().insert(ptr, alloc);
    }

    pub fn remove(&self, ptr: u64) -> Option<Alloc> {
        if ptr > TOMBSTONE {
            let start = mix(ptr) as usize;
            for i in 0..MAX_PROBE {
                let entry = &self.table[(start + i) & (TABLE_SLOTS - 1)];
                let key = entry.key.load(Acquire);
                if key == ptr {
                    let value = entry.value.load(Acquire);
                    if entry.key.compare_exchange(ptr, TOMBSTONE, Release, Relaxed).is_ok() {
                        return Some(unpack(value));
                    }
                }
                if key == EMPTY {
                    break;
                }
            }
        }
        self.overflow(ptr).lock().remove(&ptr)
    }
}

/// Device pointers are aligned, so their low bits carry nothing: mix before hashing.
#[derive(Default)]
pub struct PointerHasher(u64);

impl Hasher for PointerHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = mix(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn insert_remove_and_overflow() {
        let map = AllocMap::default();
        let a = Alloc { ordinal: 3, bytes: 12345 };
        map.insert(0x7000_0000, a);
        assert_eq!(map.remove(0x7000_0000), Some(a));
        assert_eq!(map.remove(0x7000_0000), None);
        // Values that do not pack, and more entries than one probe window holds, still work.
        let huge = Alloc { ordinal: 200, bytes: 1 << 60 };
        map.insert(0x8000_0000, huge);
        assert_eq!(map.remove(0x8000_0000), Some(huge));
        let many: Vec<u64> = (0..200_000u64).map(|i| 0x1_0000_0000 + i * 512).collect();
        for (i, p) in many.iter().enumerate() {
            map.insert(*p, Alloc { ordinal: 0, bytes: i as u64 });
        }
        for (i, p) in many.iter().enumerate() {
            assert_eq!(map.remove(*p), Some(Alloc { ordinal: 0, bytes: i as u64 }), "{i}");
        }
        assert!(map.overflow.iter().all(|m| m.lock().is_empty()));
    }

    #[test]
    fn racing_threads_keep_every_entry() {
        let map = Arc::new(AllocMap::default());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let map = map.clone();
                std::thread::spawn(move || {
                    for round in 0..50u64 {
                        let ptrs: Vec<u64> = (0..2000u64).map(|i| ((t << 40) | (round << 24) | (i << 9)) + 0x1000).collect();
                        for p in &ptrs {
                            map.insert(*p, Alloc { ordinal: t as i32, bytes: *p >> 9 });
                        }
                        for p in &ptrs {
                            assert_eq!(map.remove(*p), Some(Alloc { ordinal: t as i32, bytes: *p >> 9 }));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
