//! Which live node takes an orphaned session tree: rendezvous (highest
//! random weight) hashing of the root's id with each node's id.
//!
//! Every survivor computes the same answer from the same inputs (the root
//! and the set of live nodes at the round's instant, read from the
//! database), so the survivors of a dead node split its sessions evenly
//! without a coordinator or a message between them; and a node joining or
//! leaving moves only the roots that hash to it. The hash is a fixed
//! function of the two ids (splitmix64's finaliser over their halves), the
//! same in every build and process: nodes of different builds agree.
//!
//! It owns the choice only; claiming and activation are `failover`'s.

use uuid::Uuid;

/// splitmix64's finaliser: a bijection of `u64` with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The weight of `node` for `root`.
fn weight(root: Uuid, node: Uuid) -> u64 {
    let (r1, r2) = root.as_u64_pair();
    let (n1, n2) = node.as_u64_pair();
    mix(r1 ^ mix(r2 ^ mix(n1 ^ mix(n2))))
}

/// The node of `live` that takes `root` (`None` when `live` is empty).
pub(super) fn owner_of(root: Uuid, live: &[Uuid]) -> Option<Uuid> {
    live.iter()
        .copied()
        .max_by_key(|node| (weight(root, *node), *node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<Uuid> {
        (0..n).map(|_| Uuid::new_v4()).collect()
    }

    #[test]
    fn survivors_split_the_roots_evenly() {
        for survivors in [2, 3, 5] {
            let live = nodes(survivors);
            let roots = 30_000;
            let mut counts = vec![0usize; survivors];
            for _ in 0..roots {
                let owner = owner_of(Uuid::new_v4(), &live).unwrap();
                counts[live.iter().position(|n| *n == owner).unwrap()] += 1;
            }
            let share = roots / survivors;
            for c in &counts {
                // Binomial spread at 30,000 roots is about 1 %: 10 % is
                // far outside it and far inside "twice the share".
                assert!(
                    c.abs_diff(share) < share / 10,
                    "{counts:?} over {survivors}"
                );
            }
        }
    }

    #[test]
    fn every_node_agrees_and_order_does_not_matter() {
        let live = nodes(4);
        let mut reversed = live.clone();
        reversed.reverse();
        for _ in 0..1_000 {
            let root = Uuid::new_v4();
            assert_eq!(owner_of(root, &live), owner_of(root, &reversed));
        }
        assert_eq!(owner_of(Uuid::new_v4(), &[]), None);
    }

    #[test]
    fn a_node_leaving_moves_only_its_own_roots() {
        let live = nodes(4);
        let gone = live[2];
        let rest: Vec<Uuid> = live.iter().copied().filter(|n| *n != gone).collect();
        for _ in 0..5_000 {
            let root = Uuid::new_v4();
            let before = owner_of(root, &live).unwrap();
            let after = owner_of(root, &rest).unwrap();
            if before != gone {
                assert_eq!(before, after);
            }
        }
    }

    #[test]
    fn the_weight_is_a_fixed_function_of_the_ids() {
        // Pinned: nodes of different builds must agree on every choice.
        let root = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let node = Uuid::from_u128(0xfedc_ba98_7654_3210_fedc_ba98_7654_3210);
        assert_eq!(weight(root, node), 0x5e52_b0ce_bae5_771a_u64);
    }
}
