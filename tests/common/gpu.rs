//! The harness of the tests that need a GPU adapter (wgpu; CUDA with feature `cuda`): their
//! binaries set `harness = false` and call [`run`], so that where no adapter can be had each
//! test is reported as *ignored* — a visible count — rather than passing without running.
//! `TALLY_REQUIRE_GPU=1` (set by `.ci/run`) makes a missing driver a failure instead.

use std::path::Path;

/// Vulkan needs an installable client driver (ICD) manifest; Metal and DX12 are always there.
/// Built for CUDA (feature `cuda`) the tests always run: that build exists for the GPU machine.
fn adapter_expected() -> bool {
    if cfg!(any(feature = "cuda", target_os = "macos", target_os = "windows")) {
        return true;
    }
    let from_env = ["VK_ICD_FILENAMES", "VK_DRIVER_FILES"].iter().any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    let dirs = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"];
    from_env || dirs.iter().any(|dir| std::fs::read_dir(Path::new(dir)).is_ok_and(|mut entries| entries.next().is_some()))
}

/// `(name, test)` pairs for [`run`], each named after its function.
#[allow(unused_macros)] // the test binaries that include `common` without GPU tests
macro_rules! named {
    ($($test:ident),* $(,)?) => { vec![$((stringify!($test), $test as fn())),*] };
}
#[allow(unused_imports)] // each test binary uses one of the two
pub(crate) use named;

/// Runs `tests` with libtest's command line and output; each is ignored where no adapter is.
pub fn run(tests: Vec<(&'static str, fn())>) -> ! {
    let mut args = libtest_mimic::Arguments::from_args();
    // One test at a time unless asked: tests share the one device, and on lavapipe each dispatch
    // already runs on every core, so two at once only contend (on 2 cores: the kernel tests take
    // 538 s two at a time, 350 s one at a time; kernels_f16 113 s and 42 s).
    args.test_threads.get_or_insert(1);
    let available = adapter_expected();
    if !available {
        if std::env::var("TALLY_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            eprintln!("error: TALLY_REQUIRE_GPU=1 but no Vulkan driver is installed (apt-get install mesa-vulkan-drivers)");
            std::process::exit(101);
        }
        eprintln!("note: {} tests ignored: no Vulkan driver here (apt-get install mesa-vulkan-drivers to run them)", tests.len());
    }
    let trials = tests
        .into_iter()
        .map(|(name, test)| {
            libtest_mimic::Trial::test(name, move || {
                // On lavapipe these tests are most of CI's test time: each says what it took.
                let start = std::time::Instant::now();
                test();
                eprintln!("{name}: {:.1} s", start.elapsed().as_secs_f64());
                Ok(())
            })
            .with_ignored_flag(!available)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}
