/// Programs that run other code given to them (scripts, class files, other executables): the
/// executable the kernel shows for every Python script is the Python interpreter, so a manifest for
/// `/usr/bin/python3.11` would give its access groups to every Python script of the user.
/// `coffer manifest sign` refuses these unless forced. Ship a script as an app through a small
/// compiled launcher instead (see the ManifestFormat article's "For the agent").
package enum Interpreters {
    /// Exact executable names.
    package static let names: Set<String> = [
        "sh", "bash", "dash", "zsh", "fish", "ksh", "ksh93", "mksh", "pdksh", "csh", "tcsh", "yash", "busybox", "toybox",
        "perl", "ruby", "irb", "node", "nodejs", "deno", "bun", "java", "jshell", "kotlin", "scala", "groovy",
        "tclsh", "wish", "expect", "lua", "luajit", "php", "php-cgi", "php-fpm", "python", "pypy", "guile", "racket",
        "Rscript", "R", "julia", "ocaml", "swift", "dotnet", "mono", "pwsh", "awk", "gawk", "mawk", "nawk", "env",
        "xargs", "nohup", "setsid", "sudo", "su", "doas", "gdb", "strace", "ltrace", "valgrind", "emacs", "vim", "nvim",
        "ld.so", "qemu", "wine", "wine64",
    ]
    /// Name families followed by a version (`python3.11`, `perl5.36.0`, `lua5.4`, `php8.2`, `tclsh8.6`,
    /// `ld-linux-x86-64.so.2`, `qemu-x86_64`): the prefix then digits, dots, dashes or more.
    package static let versionedPrefixes: [String] = [
        "python", "pypy", "perl", "ruby", "lua", "luajit", "php", "tclsh", "wish", "node", "java", "guile",
        "bash", "zsh", "ksh", "gawk",
    ]
    /// Families matched by prefix alone: the dynamic loader runs any program given to it.
    package static let loaderPrefixes: [String] = ["ld-linux", "ld-musl", "qemu-"]

    /// The interpreter family `path` (or a bare name) belongs to, or nil if it is not a known interpreter.
    package static func match(_ path: String) -> String? {
        let name = path.split(separator: "/").last.map(String.init) ?? path
        if names.contains(name) { return name }
        for p in loaderPrefixes where name.hasPrefix(p) { return p }
        for p in versionedPrefixes where name.hasPrefix(p) {
            let rest = name.dropFirst(p.count)
            if let first = rest.first, first.isNumber || first == "." || first == "-" {
                if rest.allSatisfy({ $0.isNumber || $0 == "." || $0 == "-" || $0 == "m" || $0 == "d" || $0 == "u" }) { return p }
            }
        }
        return nil
    }
}
