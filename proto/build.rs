//! Compiles the runtime service's `.proto` with protox (pure Rust), so building casebatch
//! needs no system `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/casebatch/runtime/v1/runtime.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_file = out.join("runtime_descriptor.bin");
    std::fs::write(
        &descriptor_file,
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .skip_protoc_run()
        .file_descriptor_set_path(&descriptor_file)
        .compile_protos(&[proto], &["proto"])?;
    Ok(())
}
