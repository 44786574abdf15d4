//! The provided buffer ring the receives pick their buffers from.
//!
//! Pure memory: [`BufRing::new`], [`BufRing::take`], [`BufRing::bytes`],
//! [`BufRing::give_back`], [`BufRing::publish`] and the drop touch no
//! kernel interface, so their unit tests run under Miri
//! (`scripts/miri.sh`); only [`BufRing::register`] makes a system call.
//!
//! Ownership of a buffer is a value: the kernel hands buffer `bid` over with
//! a completion, [`BufRing::take`] turns that into a [`RecvBuf`] (checking
//! the id, which comes from the kernel), and only [`BufRing::give_back`],
//! which consumes the `RecvBuf`, offers the buffer again. A `RecvBuf` is
//! neither `Clone` nor `Copy` and `take` makes at most one per buffer the
//! kernel holds, so no buffer can be offered twice. That keeps the two facts
//! the ring's memory safety rests on: at most `count` entries are ever
//! offered at once (we never overwrite an entry the kernel has yet to
//! consume), and no buffer is in two entries (the kernel never writes into a
//! buffer we are reading).

use std::alloc::{Layout, alloc_zeroed, dealloc, handle_alloc_error};
use std::io;
use std::num::{NonZeroU16, NonZeroU32};
use std::ptr::{NonNull, addr_of, addr_of_mut};
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::IoUring;

/// One entry of the ring, as the kernel lays it out (`struct io_uring_buf`
/// in linux/io_uring.h). The first entry's `resv` is the ring's tail.
#[repr(C)]
struct Entry {
    addr: u64,
    len: u32,
    bid: u16,
    resv: u16,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 16);

/// A receive buffer the kernel handed us with a completion: ours to read
/// until given back with [`BufRing::give_back`], which consumes it. Not
/// `Clone`, not `Copy`, made only by [`BufRing::take`].
#[derive(Debug)]
#[must_use = "a receive buffer not given back is lost to the ring"]
pub(super) struct RecvBuf {
    bid: u16,
}

/// A provided buffer ring: `count` buffers of `size` bytes the kernel picks
/// from for receives, handed back to it after each completion is processed.
pub(super) struct BufRing {
    /// The ring of entries shared with the kernel (page aligned).
    entries: NonNull<Entry>,
    entries_layout: Layout,
    /// The buffers themselves, `count * size` bytes.
    bufs: NonNull<u8>,
    bufs_layout: Layout,
    count: u16,
    size: u32,
    /// Our tail: entries before it are the kernel's. Published by
    /// [`BufRing::publish`].
    tail: u16,
    /// One bit per buffer, set while a [`RecvBuf`] for it exists (the buffer
    /// is ours, not offered to the kernel).
    ours: Box<[u64]>,
}

impl BufRing {
    /// Allocates `count` buffers of `size` bytes and offers them all.
    /// `count` must be a power of two of at most 32768 (the kernel's
    /// limits); both are never zero, by their types.
    pub(super) fn new(count: NonZeroU16, size: NonZeroU32) -> BufRing {
        let count = count.get();
        assert!(count.is_power_of_two() && count <= 32768);
        let entries_layout = Layout::array::<Entry>(usize::from(count))
            .and_then(|l| l.align_to(rustix::param::page_size()))
            .expect("buffer ring layout");
        let bufs_layout = usize::from(count)
            .checked_mul(size.get() as usize)
            .and_then(|len| Layout::from_size_align(len, 64).ok())
            .expect("buffers layout");
        // SAFETY: neither layout has size zero: `count` and `size` are
        // non-zero by type, and an `Entry` is 16 bytes.
        let entries = unsafe { alloc_zeroed(entries_layout) };
        let entries =
            NonNull::new(entries.cast()).unwrap_or_else(|| handle_alloc_error(entries_layout));
        // SAFETY: as above.
        let bufs = unsafe { alloc_zeroed(bufs_layout) };
        let bufs = NonNull::new(bufs).unwrap_or_else(|| handle_alloc_error(bufs_layout));
        let mut ring = BufRing {
            entries,
            entries_layout,
            bufs,
            bufs_layout,
            count,
            size: size.get(),
            tail: 0,
            ours: vec![u64::MAX; usize::from(count).div_ceil(64)].into_boxed_slice(),
        };
        for bid in 0..count {
            ring.give_back(RecvBuf { bid });
        }
        ring.publish();
        ring
    }

    /// Registers the ring with the kernel under `group`.
    pub(super) fn register(&self, ring: &IoUring, group: u16) -> io::Result<()> {
        // SAFETY: the entries stay allocated, at this address, until `self`
        // drops; the loop drops the io_uring before its BufRing (field order
        // in `Uring`), and `probe` drops its ring first too.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                self.entries.as_ptr() as u64,
                self.count,
                group,
                0,
            )
        }
    }

    fn is_ours(&self, bid: u16) -> bool {
        self.ours[usize::from(bid / 64)] & (1 << (bid % 64)) != 0
    }

    /// Takes over buffer `bid`, which a completion says the kernel filled.
    /// `None` if no such buffer is the kernel's to hand over: the id is out
    /// of range, or the buffer is already ours. The id comes from the kernel
    /// and is checked, not trusted.
    pub(super) fn take(&mut self, bid: u16) -> Option<RecvBuf> {
        if bid >= self.count || self.is_ours(bid) {
            return None;
        }
        self.ours[usize::from(bid / 64)] |= 1 << (bid % 64);
        Some(RecvBuf { bid })
    }

    /// The first `len` bytes of `buf`; `None` if `len` (from the kernel) is
    /// more than a buffer holds.
    pub(super) fn bytes<'a>(&'a self, buf: &'a RecvBuf, len: usize) -> Option<&'a [u8]> {
        if len > self.size as usize {
            return None;
        }
        debug_assert!(buf.bid < self.count && self.is_ours(buf.bid));
        // SAFETY: `bid < count` (checked by `take`), so the range lies inside
        // the buffers allocation. The buffer is ours while `buf` exists: the
        // kernel does not touch it until `give_back` consumes `buf`, which
        // cannot happen while this borrow of `buf` lives.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.bufs
                    .as_ptr()
                    .add(usize::from(buf.bid) * self.size as usize),
                len,
            )
        })
    }

    /// Offers `buf` to the kernel again, at our tail (seen by the kernel
    /// after the next [`BufRing::publish`]).
    pub(super) fn give_back(&mut self, buf: RecvBuf) {
        let bid = buf.bid;
        debug_assert!(bid < self.count && self.is_ours(bid));
        self.ours[usize::from(bid / 64)] &= !(1 << (bid % 64));
        let slot = usize::from(self.tail & (self.count - 1));
        let addr = self.bufs.as_ptr() as u64 + u64::from(bid) * u64::from(self.size);
        // SAFETY: `slot < count`, inside the entries allocation. The entry is
        // ours to write: each buffer is offered at most once at a time (one
        // `RecvBuf` per buffer, consumed here), so at most `count` entries are
        // offered and the slot at our tail is one the kernel has consumed.
        // The fields are written through raw pointers, never a reference to
        // the whole entry: the first entry's `resv` is the tail, which the
        // kernel reads concurrently.
        unsafe {
            let entry = self.entries.as_ptr().add(slot);
            addr_of_mut!((*entry).addr).write(addr);
            addr_of_mut!((*entry).len).write(self.size);
            addr_of_mut!((*entry).bid).write(bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes every buffer given back so far visible to the kernel.
    pub(super) fn publish(&self) {
        // SAFETY: `entries` points to the first entry (allocated, aligned);
        // its `resv` field is the tail, a u16 aligned for an AtomicU16, and is
        // only ever accessed atomically, by us and by the kernel.
        let tail =
            unsafe { AtomicU16::from_ptr(addr_of!((*self.entries.as_ptr()).resv).cast_mut()) };
        tail.store(self.tail, Ordering::Release);
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with these layouts; the kernel no longer
        // uses them (its ring was dropped first).
        unsafe {
            dealloc(self.entries.as_ptr().cast(), self.entries_layout);
            dealloc(self.bufs.as_ptr(), self.bufs_layout);
        }
    }
}

#[cfg(test)]
mod tests {
    //! No kernel here: these run under Miri (`scripts/miri.sh`).
    use super::*;

    fn ring(count: u16, size: u32) -> BufRing {
        BufRing::new(
            NonZeroU16::new(count).unwrap(),
            NonZeroU32::new(size).unwrap(),
        )
    }

    /// Entry `slot` as the kernel would read it: (addr, len, bid).
    fn entry(r: &BufRing, slot: usize) -> (u64, u32, u16) {
        assert!(slot < usize::from(r.count));
        // SAFETY: inside the entries allocation, no other access meanwhile.
        unsafe {
            let e = r.entries.as_ptr().add(slot);
            ((*e).addr, (*e).len, (*e).bid)
        }
    }

    fn published_tail(r: &BufRing) -> u16 {
        // SAFETY: as in `publish`.
        unsafe { AtomicU16::from_ptr(addr_of!((*r.entries.as_ptr()).resv).cast_mut()) }
            .load(Ordering::Acquire)
    }

    /// What the kernel does on a receive: write into buffer `bid`.
    fn kernel_fills(r: &BufRing, bid: u16, data: &[u8]) {
        assert!(bid < r.count && data.len() <= r.size as usize);
        // SAFETY: inside the buffers allocation; nothing borrows it now.
        unsafe {
            let at = r.bufs.as_ptr().add(usize::from(bid) * r.size as usize);
            std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len());
        }
    }

    #[test]
    fn new_offers_every_buffer_once() {
        let r = ring(8, 32);
        assert_eq!(published_tail(&r), 8);
        let base = r.bufs.as_ptr() as u64;
        for slot in 0..8 {
            assert_eq!(entry(&r, slot), (base + 32 * slot as u64, 32, slot as u16));
        }
        assert_eq!(
            r.entries.as_ptr() as usize % rustix::param::page_size(),
            0,
            "the kernel wants the ring page aligned"
        );
    }

    #[test]
    fn take_checks_the_kernels_buffer_id() {
        let mut r = ring(4, 16);
        assert!(r.take(4).is_none(), "out of range");
        assert!(r.take(u16::MAX).is_none(), "out of range");
        let buf = r.take(2).expect("the kernel holds buffer 2");
        assert!(r.take(2).is_none(), "buffer 2 is already ours");
        r.give_back(buf);
        let again = r.take(2).expect("offered again");
        r.give_back(again);
    }

    #[test]
    fn received_bytes_and_give_back() {
        let mut r = ring(4, 16);
        kernel_fills(&r, 1, b"L k 10\n");
        let buf = r.take(1).unwrap();
        assert_eq!(r.bytes(&buf, 7), Some(&b"L k 10\n"[..]));
        assert_eq!(r.bytes(&buf, 16).map(<[u8]>::len), Some(16));
        assert!(r.bytes(&buf, 17).is_none(), "longer than a buffer");
        r.give_back(buf);
        // Offered at the tail (slot 4 & 3 = 0), seen once published.
        assert_eq!(entry(&r, 0).2, 1);
        assert_eq!(published_tail(&r), 4);
        r.publish();
        assert_eq!(published_tail(&r), 5);
    }

    #[test]
    fn the_tail_wraps_around_the_ring() {
        let mut r = ring(2, 8);
        let base = r.bufs.as_ptr() as u64;
        for round in 0..200u32 {
            let bid = (round % 2) as u16;
            let buf = r.take(bid).unwrap();
            r.give_back(buf);
            let slot = usize::from(r.tail.wrapping_sub(1) & 1);
            assert_eq!(entry(&r, slot), (base + 8 * u64::from(bid), 8, bid));
        }
        // And across the u16 wrap of the tail.
        r.tail = u16::MAX;
        let buf = r.take(0).unwrap();
        r.give_back(buf);
        assert_eq!(r.tail, 0);
        assert_eq!(entry(&r, 1).2, 0, "u16::MAX & 1 is slot 1");
        r.publish();
        assert_eq!(published_tail(&r), 0);
    }

    #[test]
    fn a_ring_of_one_and_the_largest_ring() {
        let mut r = ring(1, 1);
        let buf = r.take(0).unwrap();
        assert!(r.take(0).is_none());
        r.give_back(buf);
        drop(r);
        let r = ring(32768, 1);
        assert_eq!(published_tail(&r), 32768);
        assert_eq!(r.ours.len(), 512);
    }

    #[test]
    #[should_panic]
    fn count_must_be_a_power_of_two() {
        let _ = ring(3, 8);
    }
}
