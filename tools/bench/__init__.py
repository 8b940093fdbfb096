"""hostnet.llamafactory's benchmarks on the local cluster: `./dev bench --help`."""
