//! Whether a test that needs a GPU adapter (wgpu) can run here. Without one it is skipped with a
//! notice on the terminal, unless `TALLY_REQUIRE_GPU=1` (set by `.ci/run`) makes that a failure.

use std::io::Write;
use std::path::Path;

/// Vulkan needs an installable client driver (ICD) manifest; Metal and DX12 are always there.
fn adapter_expected() -> bool {
    if cfg!(any(target_os = "macos", target_os = "windows")) {
        return true;
    }
    let from_env = ["VK_ICD_FILENAMES", "VK_DRIVER_FILES"].iter().any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    let dirs = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"];
    from_env || dirs.iter().any(|dir| std::fs::read_dir(Path::new(dir)).is_ok_and(|mut entries| entries.next().is_some()))
}

/// `true` when `test` should run; prints why not otherwise. Built for CUDA (feature `cuda`), the
/// tests always run: that build exists for the GPU machine.
pub fn gpu_or_skip(test: &str) -> bool {
    if cfg!(feature = "cuda") || adapter_expected() {
        return true;
    }
    let required = std::env::var("TALLY_REQUIRE_GPU").is_ok_and(|v| v == "1");
    assert!(!required, "{test}: TALLY_REQUIRE_GPU=1 but no Vulkan driver is installed (apt-get install mesa-vulkan-drivers)");
    // Straight to the terminal: the test harness captures only print!/eprint!.
    let _ = writeln!(std::io::stderr(), "note: skipping {test}: no Vulkan driver here (apt-get install mesa-vulkan-drivers to run it)");
    false
}
