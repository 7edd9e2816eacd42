//! CC App Server host boundary (being written).
