//! Strided views of a storage: `(offset, sizes, strides, dtype)` in
//! elements, exactly as ATen keeps them, and the checks and element walks
//! reads and writes through them need.

use std::ops::Range;

use crate::dims::Dims;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A strided view of a storage, in elements of `dtype`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct View {
    pub offset: i64,
    pub sizes: Dims,
    pub strides: Dims,
    pub dtype: DType,
}

impl View {
    /// A contiguous view of `sizes` starting at element 0. Strides past
    /// 2^63 (only an empty view's sizes can ask for them) saturate.
    pub fn contiguous(sizes: &[i64], dtype: DType) -> View {
        let mut strides = Dims::filled(1, sizes.len());
        for i in (0..sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].saturating_mul(sizes[i + 1].max(1));
        }
        View {
            offset: 0,
            sizes: Dims::from(sizes),
            strides,
            dtype,
        }
    }

    pub fn numel(&self) -> usize {
        self.sizes.iter().map(|&s| s.max(0) as usize).product()
    }

    /// True when the view is the row-major layout of its sizes (ignoring
    /// strides of size-1 dims, as ATen does).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1i64;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected *= size;
        }
        true
    }

    /// True when the view is every element of a storage of `storage_bytes`,
    /// in order: reading or writing it is the storage's whole value.
    pub fn is_whole(&self, storage_bytes: usize) -> bool {
        self.offset == 0
            && self.is_contiguous()
            && self.numel() * self.dtype.size_in_bytes() == storage_bytes
    }

    /// Checks the view's shape and that every element it touches lies in a
    /// storage of `storage_elements`.
    pub fn check_within(&self, storage_elements: usize) -> Result<()> {
        if self.sizes.len() != self.strides.len() {
            return Err(Error::invalid(
                "view",
                format!("{} strides", self.sizes.len()),
                self.strides.len(),
            ));
        }
        if let Some(&bad) = self.sizes.iter().find(|&&s| s < 0) {
            return Err(Error::invalid("view size", "a size >= 0", bad));
        }
        if let Some(&bad) = self.strides.iter().find(|&&s| s < 0) {
            return Err(Error::invalid("view stride", "a stride >= 0", bad));
        }
        if self.offset < 0 {
            return Err(Error::invalid(
                "view storage offset",
                "an offset >= 0",
                self.offset,
            ));
        }
        let too_large = || {
            Error::invalid(
                format!("view of sizes {:?} strides {:?}", self.sizes, self.strides),
                "element counts and offsets that fit in 64 bits",
                "more",
            )
        };
        // Sizes whose contiguous strides overflow (possible with a 0 among
        // them, and then the element count fits) would overflow the partial
        // products lowerings compute.
        let strides_fit = self
            .sizes
            .iter()
            .try_fold(1i64, |n, &s| n.checked_mul(s.max(1)))
            .is_some();
        if !strides_fit {
            return Err(too_large());
        }
        if self.numel() == 0 {
            return Ok(());
        }
        let last = self
            .sizes
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset, |sum, (&n, &s)| {
                sum.checked_add((n - 1).checked_mul(s)?)
            })
            .ok_or_else(too_large)?;
        if last as u64 >= storage_elements as u64 {
            return Err(Error::invalid(
                format!(
                    "view of sizes {:?} strides {:?} offset {}",
                    self.sizes, self.strides, self.offset
                ),
                format!("elements below the storage's {storage_elements}"),
                format!("element {last}"),
            ));
        }
        Ok(())
    }

    /// The view with each stride-0 dim (an expanded one) cut to one element.
    pub fn without_repeated_dims(&self) -> View {
        let mut view = self.clone();
        for (size, &stride) in view.sizes.iter_mut().zip(&self.strides) {
            if stride == 0 {
                *size = (*size).min(1);
            }
        }
        view
    }

    /// Refuses a view that certainly names one storage element twice (a
    /// stride-0 dim of more than one element, or more elements than the
    /// storage has), as ATen refuses writing through one: which write wins is
    /// undefined, and an expanded view may be far larger than its storage.
    /// Only for a view `check_within` its storage.
    pub fn check_writable(&self, storage_elements: usize) -> Result<()> {
        let repeats = self
            .sizes
            .iter()
            .zip(&self.strides)
            .any(|(&size, &stride)| size > 1 && stride == 0);
        if repeats || self.numel() > storage_elements {
            return Err(Error::invalid(
                format!(
                    "writing through a view of sizes {:?} strides {:?}",
                    self.sizes, self.strides
                ),
                "a view in which no storage element appears twice (clone() it first)",
                "a view that repeats elements",
            ));
        }
        Ok(())
    }

    /// Storage element indices of the view, in row-major order of its sizes.
    /// The storage elements from the view's first to its last (empty for
    /// an empty view). Only for a view `check_within` its storage.
    pub fn span(&self) -> Range<usize> {
        let first = self.offset as usize;
        if self.numel() == 0 {
            return first..first;
        }
        let last: i64 = self
            .sizes
            .iter()
            .zip(&self.strides)
            .map(|(&size, &stride)| (size - 1) * stride)
            .sum();
        first..first + last as usize + 1
    }

    pub fn element_indices(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.numel());
        if self.numel() == 0 {
            return out;
        }
        let mut index = vec![0i64; self.sizes.len()];
        loop {
            let flat = self.offset
                + index
                    .iter()
                    .zip(&self.strides)
                    .map(|(i, s)| i * s)
                    .sum::<i64>();
            out.push(flat as usize);
            let mut d = self.sizes.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < self.sizes[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    }
}
