//! Where the items of one pass sit: packed token rows (no padding), CSR offsets per item, and
//! the prefix group each item attends to.

/// Items of one pass, packed one after the other. Items come in groups (one per request); the
/// items of a group are consecutive and share that group's prefix.
#[derive(Clone, Debug)]
pub struct ItemLayout {
    /// Item `i` owns rows `offsets[i]..offsets[i + 1]`.
    offsets: Vec<usize>,
    /// Per group: prefix length and number of items.
    groups: Vec<(usize, usize)>,
}

impl ItemLayout {
    /// `groups`: per group, its prefix length and the lengths of its items (each ≥ 1).
    pub fn new<'a>(groups: impl IntoIterator<Item = (usize, &'a [usize])>) -> Self {
        let mut offsets = vec![0];
        let mut spans = Vec::new();
        for (prefix_len, item_lens) in groups {
            for &len in item_lens {
                assert!(len > 0, "items are never empty");
                offsets.push(offsets.last().copied().unwrap_or(0) + len);
            }
            spans.push((prefix_len, item_lens.len()));
        }
        ItemLayout { offsets, groups: spans }
    }

    pub fn items(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn tokens(&self) -> usize {
        self.offsets[self.items()]
    }

    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Number of items in each group, in order.
    pub fn group_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups.iter().map(|&(_, items)| items)
    }

    pub fn item_len(&self, item: usize) -> usize {
        self.offsets[item + 1] - self.offsets[item]
    }

    pub fn max_item_len(&self) -> usize {
        (0..self.items()).map(|item| self.item_len(item)).max().unwrap_or(0)
    }

    /// The group of every item.
    pub fn item_groups(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups.iter().enumerate().flat_map(|(group, &(_, items))| std::iter::repeat_n(group, items))
    }

    /// Position of every row: item token `k` sits at `prefix_len + k`.
    pub fn positions(&self) -> Vec<usize> {
        self.item_groups()
            .enumerate()
            .flat_map(|(item, group)| (0..self.item_len(item)).map(move |k| self.groups[group].0 + k))
            .collect()
    }

    /// The row of each item's last token, where its score is read.
    pub fn last_rows(&self) -> Vec<usize> {
        self.offsets[1..].iter().map(|end| end - 1).collect()
    }
}
