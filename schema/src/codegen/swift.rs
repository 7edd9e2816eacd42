//! The swift target (being written).

use super::model::Model;
use super::GeneratedFile;

/// Every swift file the generator writes.
pub fn generate(_model: &Model) -> Vec<GeneratedFile> {
    Vec::new()
}
