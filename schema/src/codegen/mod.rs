//! The deterministic code generator: one model of the schema, one target per language, and a
//! `--check` that proves every checked-in file is what the generator writes today.

pub mod emit;
pub mod kotlin;
pub mod model;
pub mod python;
pub mod rust;
pub mod schema_info;
pub mod swift;
pub mod typescript;

use std::path::{Path, PathBuf};

/// One generated file: where it goes (relative to the workspace root) and its exact bytes.
pub struct GeneratedFile {
    pub path: PathBuf,
    pub contents: String,
}

/// Every generated file, in a fixed order.
pub fn generate_all(schema: &serde_json::Value) -> Vec<GeneratedFile> {
    let model = model::build(schema);
    let mut files = vec![GeneratedFile {
        path: PathBuf::from("core/protocol/src/generated.rs"),
        contents: rust::generate(&model),
    }];
    files.extend(typescript::generate(&model));
    files.extend(python::generate(&model));
    files.extend(kotlin::generate(&model));
    files.extend(swift::generate(&model));
    files
}

/// Files under `root` that differ from what the generator writes (missing counts as different).
pub fn stale_files(root: &Path, files: &[GeneratedFile]) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(root.join(&f.path)).ok().as_deref() != Some(f.contents.as_str())
        })
        .map(|f| f.path.clone())
        .collect()
}
