//! Writes a NoCloud seed ISO the way the libvirt providers build it, for looking at with other
//! tools or booting by hand: `cargo run -p egress-libvirt --example write_seed -- <name>
//! <user-data file> <output.iso> [vendor-data file]` (vendor-data: the guest-agent script when
//! none is given).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, user_data, out, rest @ ..] = args.as_slice() else {
        eprintln!("usage: write_seed <name> <user-data file> <output.iso> [vendor-data file]");
        return ExitCode::from(2);
    };
    let read = |path: &str| std::fs::read(path).map_err(|e| format!("{path}: {e}"));
    let result = (|| {
        let user_data = read(user_data)?;
        let vendor = match rest.first() {
            Some(path) => read(path)?,
            None => egress_libvirt::seed::vendor_data(b"", true),
        };
        let iso = egress_libvirt::seed::seed_iso(name, &user_data, &vendor).map_err(|e| e.to_string())?;
        std::fs::write(out, &iso).map_err(|e| format!("{out}: {e}"))?;
        Ok::<_, String>(iso.len())
    })();
    match result {
        Ok(bytes) => {
            println!("{out}: {bytes} bytes");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("write_seed: {e}");
            ExitCode::FAILURE
        }
    }
}
