//! The egress gateway: one proxy endpoint for any crawler. Everything lives in the library
//! (`egress_gateway::program`); see docs/gateway.md.

fn main() -> std::process::ExitCode {
    egress_gateway::program::main()
}
