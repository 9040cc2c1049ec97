//! The Squid config each Pod runs (spec/providers.md §4.6), generated from the port alone.

/// The cap on Squid's descriptors. Squid sizes per-descriptor tables from its open-file limit,
/// and container runtimes often grant a million or more, which once made Squid run out of
/// memory in its Pod; a bound keeps it small (two descriptors per tunnelled connection).
pub const MAX_FILEDESCRIPTORS: u32 = 4096;

/// The config of a proxy listening on `port`: every client allowed (the Pod is reached from
/// inside the cluster only), no cache, logs to the container's streams, no pid file (the root
/// filesystem is read-only), no headers naming the client.
pub fn squid_conf(port: u16) -> String {
    format!(
        "http_port {port}\n\
         http_access allow all\n\
         max_filedescriptors {MAX_FILEDESCRIPTORS}\n\
         cache deny all\n\
         access_log stdio:/dev/stdout\n\
         cache_log /dev/stderr\n\
         pid_filename none\n\
         coredump_dir /tmp\n\
         via off\n\
         forwarded_for off\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_listens_on_the_port_and_bounds_descriptors() {
        let conf = squid_conf(3130);
        let lines: Vec<&str> = conf.lines().collect();
        assert!(lines.contains(&"http_port 3130"), "{conf}");
        // The regression this guards: Squid sized by a container's huge file limit.
        let fds = lines
            .iter()
            .find_map(|l| l.strip_prefix("max_filedescriptors "))
            .expect("a max_filedescriptors line");
        assert!(fds.parse::<u32>().is_ok_and(|n| n > 0 && n <= 65_536), "{fds}");
        assert!(lines.contains(&"pid_filename none"));
    }
}
