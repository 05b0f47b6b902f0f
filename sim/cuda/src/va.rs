//! A simple virtual-address allocator for simulated device pointers: best fit from a
//! free list, coalescing on free, bump allocation at the top.

use std::collections::{BTreeMap, BTreeSet};

pub struct VaSpace {
    base: u64,
    end: u64,
    top: u64,
    by_addr: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

fn align_up(v: u64, a: u64) -> Option<u64> {
    v.checked_add(a - 1).map(|x| x & !(a - 1))
}

impl VaSpace {
    pub fn new(base: u64, end: u64) -> VaSpace {
        VaSpace { base, end, top: base, by_addr: BTreeMap::new(), by_size: BTreeSet::new() }
    }

    fn remove_free(&mut self, addr: u64, size: u64) {
        self.by_addr.remove(&addr);
        self.by_size.remove(&(size, addr));
    }

    fn insert_free(&mut self, addr: u64, size: u64) {
        if size == 0 {
            return;
        }
        self.by_addr.insert(addr, size);
        self.by_size.insert((size, addr));
    }

    /// Allocates `size` bytes (a multiple of 512) aligned to `align` (a power of two).
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        if size == 0 {
            return None;
        }
        // Best fit among free blocks; look at a bounded number of candidates.
        let mut found = None;
        for &(bsize, baddr) in self.by_size.range((size, 0)..).take(32) {
            let a = align_up(baddr, align)?;
            if a + size <= baddr + bsize {
                found = Some((baddr, bsize, a));
                break;
            }
        }
        if let Some((baddr, bsize, a)) = found {
            self.remove_free(baddr, bsize);
            self.insert_free(baddr, a - baddr);
            self.insert_free(a + size, baddr + bsize - (a + size));
            return Some(a);
        }
        let a = align_up(self.top, align)?;
        let new_top = a.checked_add(size)?;
        if new_top > self.end {
            return None;
        }
        let gap = a - self.top;
        if gap > 0 {
            let t = self.top;
            self.insert_free(t, gap);
        }
        self.top = new_top;
        Some(a)
    }

    /// Gives back a block returned by [`Self::alloc`].
    pub fn free(&mut self, mut addr: u64, mut size: u64) {
        if size == 0 || addr < self.base || addr + size > self.top {
            return;
        }
        if let Some((&paddr, &psize)) = self.by_addr.range(..addr).next_back() {
            if paddr + psize == addr {
                self.remove_free(paddr, psize);
                addr = paddr;
                size += psize;
            }
        }
        if let Some(&nsize) = self.by_addr.get(&(addr + size)) {
            self.remove_free(addr + size, nsize);
            size += nsize;
        }
        if addr + size == self.top {
            self.top = addr;
        } else {
            self.insert_free(addr, size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::VaSpace;

    #[test]
    fn reuse_and_coalesce() {
        let mut v = VaSpace::new(0x1000_0000, 0x2000_0000);
        let a = v.alloc(512, 512).unwrap();
        let b = v.alloc(1024, 512).unwrap();
        let c = v.alloc(2 << 20, 2 << 20).unwrap();
        assert_eq!(a, 0x1000_0000);
        assert_eq!(b, a + 512);
        assert_eq!(c % (2 << 20), 0);
        v.free(a, 512);
        v.free(b, 1024);
        let d = v.alloc(1536, 512).unwrap();
        assert_eq!(d, a);
        v.free(d, 1536);
        v.free(c, 2 << 20);
        assert_eq!(v.alloc(512, 512).unwrap(), a);
        assert!(v.alloc(0x2000_0000, 512).is_none());
    }
}
