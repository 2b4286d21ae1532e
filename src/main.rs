fn main() -> std::process::ExitCode {
    imgbuild::cli::main()
}
