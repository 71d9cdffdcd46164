//! `Dims`: a tensor's sizes (or strides), kept inline up to rank 5.
//!
//! Every op builds several types and views, and each held its sizes in a
//! `Vec`: a recorded elementwise op made ~15 small heap allocations for them
//! alone. `Dims` reads as a `[i64]` (it derefs to one) and hashes, compares
//! and prints as one, so graphs hash as they did with `Vec`s.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};

/// The rank up to which sizes need no heap allocation.
const INLINE: usize = 5;

#[derive(Clone)]
pub struct Dims(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, values: [i64; INLINE] },
    Heap(Vec<i64>),
}

impl Dims {
    pub const fn new() -> Dims {
        Dims(Repr::Inline {
            len: 0,
            values: [0; INLINE],
        })
    }

    /// `len` copies of `value`.
    pub fn filled(value: i64, len: usize) -> Dims {
        if len <= INLINE {
            Dims(Repr::Inline {
                len: len as u8,
                values: [value; INLINE],
            })
        } else {
            Dims(Repr::Heap(vec![value; len]))
        }
    }

    pub fn as_slice(&self) -> &[i64] {
        match &self.0 {
            Repr::Inline { len, values } => &values[..*len as usize],
            Repr::Heap(v) => v,
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [i64] {
        match &mut self.0 {
            Repr::Inline { len, values } => &mut values[..*len as usize],
            Repr::Heap(v) => v,
        }
    }

    /// The sizes as a `Vec`, moving them onto the heap if they were inline.
    fn heap(&mut self) -> &mut Vec<i64> {
        if let Repr::Inline { .. } = self.0 {
            self.0 = Repr::Heap(self.as_slice().to_vec());
        }
        match &mut self.0 {
            Repr::Heap(v) => v,
            Repr::Inline { .. } => unreachable!("moved to the heap above"),
        }
    }

    pub fn push(&mut self, value: i64) {
        match &mut self.0 {
            Repr::Inline { len, values } if (*len as usize) < INLINE => {
                values[*len as usize] = value;
                *len += 1;
            }
            _ => self.heap().push(value),
        }
    }

    pub fn pop(&mut self) -> Option<i64> {
        match &mut self.0 {
            Repr::Inline { len: 0, .. } => None,
            Repr::Inline { len, values } => {
                *len -= 1;
                Some(values[*len as usize])
            }
            Repr::Heap(v) => v.pop(),
        }
    }

    /// Inserts `value` at `index`, shifting the later sizes (as `Vec::insert`).
    pub fn insert(&mut self, index: usize, value: i64) {
        match &mut self.0 {
            Repr::Inline { len, values } if (*len as usize) < INLINE => {
                let n = *len as usize;
                assert!(index <= n, "insertion index {index} is past the length {n}");
                values.copy_within(index..n, index + 1);
                values[index] = value;
                *len += 1;
            }
            _ => self.heap().insert(index, value),
        }
    }

    /// Removes and returns the size at `index` (as `Vec::remove`).
    pub fn remove(&mut self, index: usize) -> i64 {
        match &mut self.0 {
            Repr::Inline { len, values } => {
                let n = *len as usize;
                assert!(
                    index < n,
                    "removal index {index} is not below the length {n}"
                );
                let removed = values[index];
                values.copy_within(index + 1..n, index);
                *len -= 1;
                removed
            }
            Repr::Heap(v) => v.remove(index),
        }
    }

    pub fn truncate(&mut self, new_len: usize) {
        match &mut self.0 {
            Repr::Inline { len, .. } if new_len < *len as usize => *len = new_len as u8,
            Repr::Inline { .. } => {}
            Repr::Heap(v) => v.truncate(new_len),
        }
    }

    pub fn extend_from_slice(&mut self, values: &[i64]) {
        for &v in values {
            self.push(v);
        }
    }

    pub fn to_vec(&self) -> Vec<i64> {
        self.as_slice().to_vec()
    }
}

impl Default for Dims {
    fn default() -> Dims {
        Dims::new()
    }
}

impl Deref for Dims {
    type Target = [i64];
    fn deref(&self) -> &[i64] {
        self.as_slice()
    }
}

impl DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [i64] {
        self.as_mut_slice()
    }
}

impl AsRef<[i64]> for Dims {
    fn as_ref(&self) -> &[i64] {
        self.as_slice()
    }
}

impl std::borrow::Borrow<[i64]> for Dims {
    fn borrow(&self) -> &[i64] {
        self.as_slice()
    }
}

impl From<&[i64]> for Dims {
    fn from(values: &[i64]) -> Dims {
        if values.len() <= INLINE {
            let mut inline = [0; INLINE];
            inline[..values.len()].copy_from_slice(values);
            Dims(Repr::Inline {
                len: values.len() as u8,
                values: inline,
            })
        } else {
            Dims(Repr::Heap(values.to_vec()))
        }
    }
}

impl From<&Vec<i64>> for Dims {
    fn from(values: &Vec<i64>) -> Dims {
        Dims::from(values.as_slice())
    }
}

impl From<&Dims> for Dims {
    fn from(values: &Dims) -> Dims {
        values.clone()
    }
}

impl From<Vec<i64>> for Dims {
    fn from(values: Vec<i64>) -> Dims {
        if values.len() <= INLINE {
            Dims::from(values.as_slice())
        } else {
            Dims(Repr::Heap(values))
        }
    }
}

impl<const N: usize> From<[i64; N]> for Dims {
    fn from(values: [i64; N]) -> Dims {
        Dims::from(values.as_slice())
    }
}

impl From<Dims> for Vec<i64> {
    fn from(dims: Dims) -> Vec<i64> {
        match dims.0 {
            Repr::Heap(v) => v,
            Repr::Inline { .. } => dims.to_vec(),
        }
    }
}

impl FromIterator<i64> for Dims {
    fn from_iter<I: IntoIterator<Item = i64>>(iter: I) -> Dims {
        let mut dims = Dims::new();
        for v in iter {
            dims.push(v);
        }
        dims
    }
}

impl Extend<i64> for Dims {
    fn extend<I: IntoIterator<Item = i64>>(&mut self, iter: I) {
        for v in iter {
            self.push(v);
        }
    }
}

impl<'a> IntoIterator for &'a Dims {
    type Item = &'a i64;
    type IntoIter = std::slice::Iter<'a, i64>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl IntoIterator for Dims {
    type Item = i64;
    type IntoIter = std::vec::IntoIter<i64>;
    fn into_iter(self) -> Self::IntoIter {
        Vec::from(self).into_iter()
    }
}

impl PartialEq for Dims {
    fn eq(&self, other: &Dims) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Dims {}

impl PartialEq<[i64]> for Dims {
    fn eq(&self, other: &[i64]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<&[i64]> for Dims {
    fn eq(&self, other: &&[i64]) -> bool {
        self.as_slice() == *other
    }
}

impl PartialEq<Vec<i64>> for Dims {
    fn eq(&self, other: &Vec<i64>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialEq<Dims> for Vec<i64> {
    fn eq(&self, other: &Dims) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialEq<Dims> for [i64] {
    fn eq(&self, other: &Dims) -> bool {
        self == other.as_slice()
    }
}

impl<const N: usize> PartialEq<[i64; N]> for Dims {
    fn eq(&self, other: &[i64; N]) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Hash for Dims {
    /// As a `[i64]` (and so as the `Vec<i64>` it replaced): cache keys of
    /// graphs do not change.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state)
    }
}

impl fmt::Debug for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::DefaultHasher;

    fn hash_of(value: &impl Hash) -> u64 {
        let mut h = DefaultHasher::new();
        value.hash(&mut h);
        h.finish()
    }

    #[test]
    fn reads_hashes_and_prints_as_a_vec_at_every_rank() {
        for rank in 0..9 {
            let v: Vec<i64> = (0..rank as i64).map(|i| i * 7 - 3).collect();
            let d = Dims::from(v.clone());
            assert_eq!(d.as_slice(), v.as_slice());
            assert_eq!(hash_of(&d), hash_of(&v));
            assert_eq!(format!("{d:?}"), format!("{v:?}"));
            assert_eq!(d.iter().copied().collect::<Dims>(), d);
            assert_eq!(Vec::from(d.clone()), v);
        }
    }

    #[test]
    fn edits_across_the_inline_limit_keep_the_values() {
        let mut d = Dims::new();
        let mut v = Vec::new();
        for i in 0..8 {
            d.push(i);
            v.push(i);
            assert_eq!(d, v);
        }
        d.insert(2, 40);
        v.insert(2, 40);
        assert_eq!(d, v);
        assert_eq!(d.remove(0), v.remove(0));
        d.truncate(3);
        v.truncate(3);
        assert_eq!(d, v);
        // Past the length (even past what a u8 holds): nothing changes.
        d.truncate(256);
        v.truncate(256);
        assert_eq!(d, v);
        assert_eq!(d.pop(), v.pop());
        d.extend_from_slice(&[5, 6, 7, 8, 9]);
        v.extend_from_slice(&[5, 6, 7, 8, 9]);
        assert_eq!(d, v);
        d[1] = -1;
        v[1] = -1;
        assert_eq!(d, v);
        let mut inline = Dims::from([1, 2, 3]);
        inline.truncate(256);
        assert_eq!(inline, [1, 2, 3]);
        inline.truncate(1);
        assert_eq!(inline, [1]);
        assert_eq!(Dims::filled(1, 7), vec![1; 7]);
        assert_eq!(Dims::filled(2, 3), [2, 2, 2]);
    }
}
