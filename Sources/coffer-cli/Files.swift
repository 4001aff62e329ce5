import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferCrypto
import CofferModel
import Glibc

/// `coffer files …`: protected directories, the file protection classes on the kernel's fscrypt (issue #45).
struct FilesCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "files",
        abstract: "Protect directories with a protection class: locked with the keychain, on the kernel's fscrypt.",
        discussion: """
            A protected directory is encrypted by the kernel (fscrypt, ext4 or f2fs with the encrypt feature) \
            with its own random key, which the agent keeps wrapped by the class key. complete: readable while \
            the keychain is unlocked; complete-unless-open: the same, and files open at the lock stay usable \
            until closed; until-first-auth: from the first unlock until 'coffer files lock --all'; none: \
            whenever the agent runs.
            """,
        subcommands: [Protect.self, List.self, Status.self, Lock.self, Drop.self])

    /// `path` made absolute without following its last component (a symbolic link there is refused by
    /// the agent, not silently replaced by its target): the directory holding it resolved with realpath.
    static func absolute(_ path: String) throws(SecError) -> String {
        var p = path
        while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
        if !p.hasPrefix("/") {
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            guard getcwd(&buffer, buffer.count) != nil else { throw SecError(.param, "cannot read the working directory") }
            p = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) + "/" + p
        }
        let slash = p.lastIndex(of: "/")!
        let base = String(p[p.index(after: slash)...])
        let parent = slash == p.startIndex ? "/" : String(p[..<slash])
        guard base != "." && base != ".." && !base.isEmpty else {
            guard let r = realpath(p, nil) else { throw SecError(.itemNotFound, "\(path) does not exist") }
            defer { free(r) }
            return String(cString: r)
        }
        guard let r = realpath(parent, nil) else { throw SecError(.itemNotFound, "\(parent) does not exist") }
        defer { free(r) }
        let resolved = String(cString: r)
        return (resolved == "/" ? "" : resolved) + "/" + base
    }

    static func print(_ dirs: [ProtectedDirectoryStatus], json: Bool) {
        if json {
            let objects = dirs.map { d in
                "{" + [
                    Output.json("path") + ":" + Output.json(d.path),
                    Output.json("class") + ":" + Output.json(d.protection.cliName),
                    Output.json("key") + ":" + Output.json(d.keyState == .present ? "present" : d.keyState == .absent ? "absent"
                                                            : d.keyState == .incompletelyRemoved ? "incompletely-removed" : "unknown"),
                    Output.json("keyIdentifier") + ":" + Output.json(Hex.encode(d.keyIdentifier)),
                    Output.json("openFiles") + ":[" + d.holders.map { "{\(Output.json("pid")):\($0.pid),\(Output.json("name")):\(Output.json($0.name))}" }
                        .joined(separator: ",") + "]",
                    Output.json("problem") + ":" + (d.problem.isEmpty ? "null" : Output.json(d.problem)),
                ].joined(separator: ",") + "}"
            }
            Output.print("[" + objects.joined(separator: ",") + "]")
            return
        }
        for d in dirs {
            var line = "\(Output.escapedText(d.path))  \(d.protection.cliName)  \(d.keyState.text)"
            if !d.holders.isEmpty {
                line += "  open by: " + d.holders.map { "\(Output.escapedText($0.name)) (pid \($0.pid))" }.joined(separator: ", ")
            }
            if !d.problem.isEmpty { line += "  problem: " + Output.escapedText(d.problem) }
            Output.print(line)
        }
    }

    struct Protect: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make DIR a protected directory (an empty one in place; a non-empty one is copied, synced and swapped in).")
        @OptionGroup var connect: Connect
        @Argument(help: "The directory (yours, on ext4 or f2fs with the encrypt feature).") var directory: String
        @Option(name: .customLong("class"), help: "complete, complete-unless-open, until-first-auth or none.") var protection: String

        func run() throws {
            try reporting { () throws(SecError) in
                guard let c = FileProtection(cliName: protection) else {
                    throw SecError(.param, "unknown class \(protection): complete, complete-unless-open, until-first-auth or none")
                }
                let dirs = try connect.open().files(.protect(path: try FilesCommand.absolute(directory), protection: c))
                FilesCommand.print(dirs, json: false)
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the protected directories, their class and whether they are unlocked.")
        @OptionGroup var connect: Connect
        @Flag(help: "Print JSON.") var json = false

        func run() throws {
            try reporting { () throws(SecError) in FilesCommand.print(try connect.open().files(.status(path: nil)), json: json) }
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show protected directories (or DIR): class, key state, and processes holding files open after a lock.")
        @OptionGroup var connect: Connect
        @Argument(help: "One protected directory (default: all).") var directory: String?
        @Flag(help: "Print JSON.") var json = false

        func run() throws {
            try reporting { () throws(SecError) in
                let path = try directory.map { (d) throws(SecError) in try FilesCommand.absolute(d) }
                FilesCommand.print(try connect.open().files(.status(path: path)), json: json)
            }
        }
    }

    struct Lock: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove every protected directory's key now, whatever its class (they return at the next unlock).")
        @OptionGroup var connect: Connect
        @Flag(help: "All protected directories (required).") var all = false

        func validate() throws {
            guard all else { throw ValidationError("coffer files lock needs --all") }
        }

        func run() throws {
            try reporting { () throws(SecError) in FilesCommand.print(try connect.open().files(.lockAll), json: false) }
        }
    }

    struct Drop: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write standard input as the file NAME of a complete-unless-open directory, also while locked.",
            discussion: """
                While the keychain is locked the file is sealed to the directory's drop key and written into the \
                directory at the next unlock (reading it needs the unlock, as on iOS). At most 64 MiB (a file over \
                191 KiB goes in parts, and appears once all of it reached the agent).
                """)
        @OptionGroup var connect: Connect
        @Argument(help: "The complete-unless-open directory.") var directory: String
        @Argument(help: "The file's name in it.") var name: String

        func run() throws {
            try reporting { () throws(SecError) in
                let path = try FilesCommand.absolute(directory)
                let connection = try connect.open()
                // Standard input in pieces of what one request carries: a file that fits one is one drop,
                // a larger one goes in parts (at most AgentConnection.maximumPartedFileBytes), one piece
                // in memory at a time.
                let limit = AgentConnection.maximumFileDropBytes
                var total = 0
                func piece() throws(SecError) -> SecureBytes? {
                    let buffer = SecureBytes(count: limit)
                    var n = 0
                    while n < limit {
                        let r = buffer.withUnsafeMutableBytes { read(0, $0.baseAddress! + n, limit - n) }
                        if r < 0 && errno == EINTR { continue }
                        guard r >= 0 else { buffer.wipe(); throw SecError(.io, "cannot read standard input") }
                        if r == 0 { break }
                        n += r
                    }
                    defer { buffer.wipe() }
                    total += n
                    guard total <= AgentConnection.maximumPartedFileBytes else {
                        throw SecError(.param, "a file written this way holds at most \(AgentConnection.maximumPartedFileBytes >> 20) MiB")
                    }
                    guard n > 0 else { return nil }
                    return buffer.slice(0..<n)
                }
                let first = try piece() ?? SecureBytes(count: 0)
                if first.count < limit {
                    defer { first.wipe() }
                    _ = try connection.files(.drop(path: path, name: name, data: first))
                } else {
                    var pending: SecureBytes? = first
                    try connection.writeFile(named: name, into: path) { () throws(SecError) -> SecureBytes? in
                        if let p = pending { pending = nil; return p }
                        return try piece()
                    }
                }
                let dirs = try connection.files(.status(path: path))
                FilesCommand.print(dirs, json: false)
            }
        }
    }
}
