//! How one value is laid out over the partitions of an SPMD program: cut
//! into equal tiles along some of its dims, each tile held by one or more
//! partitions. This is XLA's `HloSharding` in the terms the engine needs:
//! which bytes each partition holds.

use crate::error::{Error, Result};

/// The layout of a value over the partitions of a mesh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sharding {
    /// Tiles along each dim of the value (1: the dim is not split).
    pub tiles: Vec<i64>,
    /// Copies of each tile.
    pub replicas: i64,
    /// The partition holding each (tile, copy), row-major over `tiles` and
    /// then the copy. A partition holds one tile at most; one not listed
    /// holds none (its buffer is not part of the value).
    pub partitions: Vec<usize>,
}

impl Sharding {
    /// Every one of `partitions` holds the whole value.
    pub fn replicated(rank: usize, partitions: usize) -> Sharding {
        Sharding {
            tiles: vec![1; rank],
            replicas: partitions as i64,
            partitions: (0..partitions).collect(),
        }
    }

    /// A sharding of `tiles` with `replicas` copies, checked: the
    /// partitions list each (tile, copy) once, no partition twice, all below
    /// `num_partitions`.
    pub fn new(
        tiles: Vec<i64>,
        replicas: i64,
        partitions: Vec<usize>,
        num_partitions: usize,
    ) -> Result<Sharding> {
        let positions = tiles.iter().chain([&replicas]).try_fold(1i64, |n, &t| {
            if t >= 1 {
                n.checked_mul(t)
            } else {
                None
            }
        });
        if positions != Some(partitions.len() as i64) {
            return Err(Error::invalid(
                "a sharding",
                format!("one partition per (tile, copy) of tiles {tiles:?} x {replicas} copies"),
                format!("{} partitions", partitions.len()),
            ));
        }
        let mut seen = vec![false; num_partitions];
        for &p in &partitions {
            match seen.get_mut(p) {
                Some(s) if !*s => *s = true,
                _ => {
                    return Err(Error::invalid(
                        "a sharding's partitions",
                        format!("distinct partitions below {num_partitions}"),
                        format!("{partitions:?}"),
                    ))
                }
            }
        }
        Ok(Sharding {
            tiles,
            replicas,
            partitions,
        })
    }

    /// No dim is split.
    pub fn is_replicated(&self) -> bool {
        self.tiles.iter().all(|&t| t == 1)
    }

    /// Checks that the tiles cut a value of `dims` evenly.
    pub fn check_dims(&self, dims: &[i64]) -> Result<()> {
        if dims.len() != self.tiles.len() {
            return Err(Error::invalid(
                "a sharding",
                format!("one tile count per dim of a rank-{} value", dims.len()),
                format!("tiles {:?}", self.tiles),
            ));
        }
        if let Some(d) = (0..dims.len()).find(|&d| dims[d] % self.tiles[d] != 0) {
            return Err(Error::invalid(
                format!(
                    "sharding dim {d} of size {} into {} tiles",
                    dims[d], self.tiles[d]
                ),
                format!("a size divisible by {}", self.tiles[d]),
                dims[d],
            ));
        }
        Ok(())
    }

    /// The dims of one tile of a value of `dims` (checked by `check_dims`).
    pub fn tile_dims(&self, dims: &[i64]) -> Vec<i64> {
        dims.iter().zip(&self.tiles).map(|(&d, &t)| d / t).collect()
    }

    /// The tile partition `p` holds (its index along each dim), if any.
    pub fn tile_of(&self, partition: usize) -> Option<Vec<i64>> {
        let mut position = self.partitions.iter().position(|&q| q == partition)? as i64;
        position /= self.replicas;
        let mut index = vec![0; self.tiles.len()];
        for d in (0..self.tiles.len()).rev() {
            index[d] = position % self.tiles[d];
            position /= self.tiles[d];
        }
        Some(index)
    }

    /// The first partition holding each tile, tiles in row-major order.
    pub fn tile_holders(&self) -> impl Iterator<Item = usize> + '_ {
        self.partitions
            .iter()
            .step_by(self.replicas as usize)
            .copied()
    }

    /// The text of XLA's `mhlo.sharding` attribute for this layout over
    /// `num_partitions` partitions.
    pub fn to_hlo_text(&self, num_partitions: usize) -> String {
        if self.is_replicated() && self.replicas as usize == num_partitions {
            return "{replicated}".to_string();
        }
        if self.is_replicated() && self.partitions.len() == 1 {
            return format!("{{maximal device={}}}", self.partitions[0]);
        }
        let mut dims: Vec<String> = self.tiles.iter().map(i64::to_string).collect();
        if self.replicas > 1 {
            dims.push(self.replicas.to_string());
        }
        let partitions: Vec<String> = self.partitions.iter().map(usize::to_string).collect();
        format!(
            "{{devices=[{}]{}{}}}",
            dims.join(","),
            partitions.join(","),
            if self.replicas > 1 {
                " last_tile_dim_replicate"
            } else {
                ""
            }
        )
    }
}

/// The runs of contiguous elements that one tile of a row-major value of
/// `dims` is made of: `(offset in the value, offset in the tile, length)`,
/// in elements, for the tile starting at element index `start` of each dim.
pub fn tile_runs(dims: &[i64], tile: &[i64], start: &[i64]) -> Vec<(usize, usize, usize)> {
    let rank = dims.len();
    if rank == 0 {
        return vec![(0, 0, 1)];
    }
    if tile.contains(&0) {
        return Vec::new();
    }
    let run = tile[rank - 1] as usize;
    let rows: i64 = tile[..rank - 1].iter().product();
    let mut runs = Vec::with_capacity(rows as usize);
    let mut row = vec![0i64; rank - 1];
    for r in 0..rows as usize {
        let mut offset = 0i64;
        for d in 0..rank {
            let at = start[d] + if d + 1 < rank { row[d] } else { 0 };
            offset = offset * dims[d] + at;
        }
        runs.push((offset as usize, r * run, run));
        for d in (0..rank - 1).rev() {
            row[d] += 1;
            if row[d] < tile[d] {
                break;
            }
            row[d] = 0;
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_are_found_row_major_with_copies_last() {
        // 2 x 1 tiles, 2 copies each, over partitions 0..4: (tile 0: 0, 1), (tile 1: 2, 3).
        let s = Sharding::new(vec![2, 1], 2, vec![0, 1, 2, 3], 4).unwrap();
        assert_eq!(s.tile_of(1), Some(vec![0, 0]));
        assert_eq!(s.tile_of(2), Some(vec![1, 0]));
        assert_eq!(s.tile_holders().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(
            s.to_hlo_text(4),
            "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
        );
        assert_eq!(Sharding::replicated(2, 4).to_hlo_text(4), "{replicated}");
    }

    #[test]
    fn bad_shardings_are_refused() {
        assert!(Sharding::new(vec![2], 1, vec![0, 0], 2).is_err());
        assert!(Sharding::new(vec![2], 1, vec![0], 2).is_err());
        assert!(Sharding::new(vec![2], 1, vec![0, 5], 2).is_err());
        let s = Sharding::new(vec![2, 1], 1, vec![0, 1], 2).unwrap();
        assert!(s.check_dims(&[3, 4]).is_err());
        assert!(s.check_dims(&[4]).is_err());
        assert!(s.check_dims(&[4, 3]).is_ok());
    }

    #[test]
    fn tile_runs_cover_a_column_tile() {
        // A 2x4 value, its right 2x2 tile: elements 2, 3 and 6, 7.
        assert_eq!(
            tile_runs(&[2, 4], &[2, 2], &[0, 2]),
            vec![(2, 0, 2), (6, 2, 2)]
        );
    }
}
