import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// The man pages and shell completions of issue #17: each page renders without a warning, coffer(1)
/// names every command the CLI has, and the completions the CLI generates load and complete in bash,
/// zsh and fish (each skipped, with the reason, where the tool is missing).
@Suite struct ManPageTests {
    static let pages = ["coffer.1", "cofferd.8", "pam_coffer.8", "pinentry-coffer.1", "git-credential-coffer.1", "coffer-secret-service.1",
                         "coffer-portal-secret.1"]
    static var manDirectory: String { Binaries.packageRoot + "/contrib/man" }
    static func has(_ tool: String) -> Bool {
        ["/usr/bin/", "/bin/", "/usr/local/bin/"].contains { FileManager.default.isExecutableFile(atPath: $0 + tool) }
    }

    @Test(.enabled(if: has("man"), "man (man-db) is not installed: contrib/deps.sh installs it"), arguments: pages)
    func rendersWithoutWarnings(_ page: String) throws {
        let path = Self.manDirectory + "/" + page
        #expect(FileManager.default.fileExists(atPath: path), "\(page) is missing")
        // man -l with groff's warnings on; the page goes to /dev/null, what remains is every warning.
        let r = runShell("MANWIDTH=80 LC_ALL=C.UTF-8 man --warnings -l '\(path)' 2>&1 >/dev/null", socket: "")
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.isEmpty, "\(page): \(r)")
        let text = runShell("MANWIDTH=80 LC_ALL=C.UTF-8 man -l '\(path)' 2>/dev/null | col -b", socket: "").stdout
        #expect(text.contains("NAME") && text.contains("SEE ALSO"), "\(page) renders without its sections: \(text.prefix(300))")
    }

    /// Every command and subcommand of the CLI (from its own description of itself) has a `.B` line in coffer(1).
    @Test func cofferPageNamesEveryCommand() throws {
        let dump = runShell("'\(Binaries.directory)/coffer-cli' --experimental-dump-help", socket: "")
        #expect(dump.status == 0, "\(dump)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(dump.stdout.utf8)) as? [String: Any])
        let command = try #require(json["command"] as? [String: Any])
        let subcommands = try #require(command["subcommands"] as? [[String: Any]])
        let page = try String(contentsOfFile: Self.manDirectory + "/coffer.1", encoding: .utf8)
        // The `.B` lines with roff's escapes taken out: `.B la can\-evaluate|evaluate` → "la can-evaluate|evaluate".
        let lines = page.split(separator: "\n").filter { $0.hasPrefix(".B ") }.map {
            $0.dropFirst(3).replacingOccurrences(of: "\\-", with: "-").replacingOccurrences(of: "\\fI", with: "")
                .replacingOccurrences(of: "\\fP", with: "").replacingOccurrences(of: "\\fB", with: "")
        }
        var names: [String] = []
        for sub in subcommands {
            let name = try #require(sub["commandName"] as? String)
            guard name != "help" else { continue }
            names.append(name)
            let mine = lines.filter { $0 == name || $0.hasPrefix(name + " ") }
            #expect(!mine.isEmpty, "coffer(1) has no .B line for 'coffer \(name)'")
            for child in (sub["subcommands"] as? [[String: Any]]) ?? [] {
                guard let childName = child["commandName"] as? String, childName != "help" else { continue }
                let words = mine.flatMap { $0.split(whereSeparator: { " |[]()".contains($0) }).map(String.init) }
                #expect(words.contains(childName), "coffer(1) does not name 'coffer \(name) \(childName)'")
            }
        }
        #expect(names.contains("run") && names.contains("inject") && names.count >= 15, "\(names)")
    }

    private func completionScript(_ shell: String, in dir: TemporaryDirectory) throws -> String {
        // Through `coffer` (which hands the option to coffer-cli), as the install script's users would.
        let r = runCLI(["--generate-completion-script", shell])
        #expect(r.status == 0 && r.stdout.count > 1000, "\(shell): \(r.status) \(r.stderr)")
        let path = dir.file("coffer.\(shell)")
        try r.stdout.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    @Test(.enabled(if: has("bash"), "bash is not installed")) func bashCompletes() throws {
        let dir = TemporaryDirectory("coffer-completion")
        let script = try completionScript("bash", in: dir)
        // Load it and ask, as bash's programmable completion does (the function gets command, word, previous word).
        let r = runShell("""
            bash --norc --noprofile -c '
            source "$0" || exit 90
            complete -p coffer || exit 91
            COMP_WORDS=(coffer ru); COMP_CWORD=1; COMP_LINE="coffer ru"; COMP_POINT=9; COMPREPLY=()
            _coffer coffer ru coffer; echo "top: ${COMPREPLY[*]}"
            COMP_WORDS=(coffer get --for); COMP_CWORD=2; COMP_LINE="coffer get --for"; COMP_POINT=16; COMPREPLY=()
            _coffer coffer --for get; echo "get: ${COMPREPLY[*]}"
            ' '\(script)'
            """, socket: "")
        #expect(r.status == 0 && r.stdout.contains("complete -o filenames -F _coffer coffer"), "\(r)")
        #expect(r.stdout.contains("top: run\n") && r.stdout.contains("get: --format\n"), "\(r)")
    }

    @Test(.enabled(if: has("zsh"), "zsh is not installed (contrib/deps.sh installs it)")) func zshLoads() throws {
        let dir = TemporaryDirectory("coffer-completion")
        let script = try completionScript("zsh", in: dir)
        // As installed: _coffer in a directory on fpath, found by compinit and autoloaded.
        let fpath = dir.file("site-functions")
        try FileManager.default.createDirectory(atPath: fpath, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: script, toPath: fpath + "/_coffer")
        let r = runShell("""
            HOME='\(dir.path)' zsh -f -c 'fpath=("$0" $fpath); autoload -U compinit; compinit -u -d "$HOME/.zcompdump" || exit 90; \
            echo "binding: ${_comps[coffer]}"; autoload +X _coffer && whence -w _coffer' '\(fpath)'
            """, socket: "")
        #expect(r.status == 0 && r.stdout.contains("binding: _coffer") && r.stdout.contains("_coffer: function"), "\(r)")
        #expect(r.stderr.isEmpty, "\(r)")
    }

    @Test(.enabled(if: has("fish"), "fish is not installed (contrib/deps.sh installs it)")) func fishCompletes() throws {
        let dir = TemporaryDirectory("coffer-completion")
        let script = try completionScript("fish", in: dir)
        let r = runShell("""
            HOME='\(dir.path)' fish --no-config -c 'source $argv[1]; or exit 90; complete -C "coffer ru"; complete -C "coffer get --for"' '\(script)'
            """, socket: "")
        #expect(r.status == 0 && r.stdout.contains("run\t") && r.stdout.contains("--format\t"), "\(r)")
        #expect(r.stderr.isEmpty, "\(r)")
    }
}
