//! Wall-clock timestamps in the wire form (being written).
