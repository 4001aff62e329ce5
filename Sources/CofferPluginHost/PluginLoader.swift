import CCofferPlugin
package import CofferPluginProtocol
import CofferSystem
import Glibc

/// Writes one line to stderr (the host's log): `coffer-plugin-host: …`, control characters escaped.
package func hostLog(_ line: String) {
    StandardStreams.printError("coffer-plugin-host: " + sanitizedText(line, max: 2048).replacingNewlines())
}

extension String {
    func replacingNewlines() -> String { split(separator: "\n", omittingEmptySubsequences: false).joined(separator: "\\n") }
}

/// The per-plugin context of the `log` host callback (kept alive as long as the plugin).
final class LogContext {
    let name: String
    init(name: String) { self.name = name }
}

/// One plugin loaded into this process: its table, its state, and the lock that runs one evaluation at a time.
@safe package final class LoadedPlugin: @unchecked Sendable {
    // @unchecked Sendable: the table is immutable static plugin memory; `state` is the plugin's
    // own, documented as usable from several threads (ABI: calls come from any thread); `busy`
    // serializes begin_evaluation.
    // @safe: the pointers are the plugin's table, state and host table, which live as long as the
    // plugin stays loaded (it is never unloaded); every use of them is marked `unsafe`.
    package let name: String
    package let file: String
    let table: UnsafePointer<coffer_plugin_v1>
    let state: UnsafeMutableRawPointer?
    let host: UnsafeMutablePointer<coffer_host_v1>
    let busy = Protected(false)

    init(name: String, file: String, table: UnsafePointer<coffer_plugin_v1>, state: UnsafeMutableRawPointer?,
         host: UnsafeMutablePointer<coffer_host_v1>) {
        self.name = name; self.file = file; unsafe self.table = unsafe table; unsafe self.state = unsafe state; unsafe self.host = unsafe host
    }

    /// The enrolled count and domain state; nil domain state when the plugin has none.
    package func enrollment() -> (code: Int32, count: UInt32, domainState: [UInt8]?) {
        guard let f = unsafe table.pointee.enrollment_state else { return (Int32(COFFER_STATUS_UNSUPPORTED.rawValue), 0, nil) }
        var count: UInt32 = 0
        var domain = [UInt8](repeating: 0, count: PluginWire.domainStateBytes)
        let rc = unsafe domain.withUnsafeMutableBufferPointer { unsafe f(state, &count, $0.baseAddress) }
        return rc == 0 ? (0, count, domain) : (rc, 0, nil)
    }

    /// What HELLO_REPLY says about this plugin.
    package var info: PluginInfo {
        let e = enrollment()
        return unsafe PluginInfo(name: name, kind: UInt8(truncatingIfNeeded: table.pointee.kind), capabilities: table.pointee.capabilities,
                          enrolledCount: e.count, domainState: e.domainState)
    }
}

/// What the host found in its plugin directories.
package struct LoadResult: @unchecked Sendable {
    // @unchecked Sendable: LoadedPlugin is itself Sendable; the array is built once and then read.
    package var plugins: [LoadedPlugin] = []
    package var refused: [RefusedPlugin] = []
    package init() {}
}

/// Finds, checks and loads `*.so` plugins (`dlopen(RTLD_NOW | RTLD_LOCAL)` of the checked file
/// itself, through `/proc/self/fd`, so what was checked is what is loaded).
package enum PluginLoader {
    /// Loads every acceptable plugin of `directories`, in order (a name already loaded from an
    /// earlier file is refused). Each plugin gets `stateRoot/NAME` (0700) as its state directory.
    /// Every refusal is logged to stderr as `refused FILE: REASON` and listed in the result.
    package static func load(directories: [String], stateRoot: String, requireRoot: Bool = false) -> LoadResult {
        load(directories.map { ($0, requireRoot) }, stateRoot: stateRoot)
    }

    /// As ``load(directories:stateRoot:requireRoot:)``, each directory with its own rule: a system
    /// directory (`true`) and everything in it must belong to root; others to root or this user.
    package static func load(_ directories: [(path: String, requireRoot: Bool)], stateRoot: String) -> LoadResult {
        var result = LoadResult()
        var keepOpen: [Int32] = []
        defer { for fd in keepOpen { close(fd) } }
        func refuse(_ file: String, _ reason: String) {
            hostLog("refused \(file): \(reason)")
            result.refused.append(RefusedPlugin(file: String(file.prefix(4096)), reason: String(reason.prefix(1000))))
        }
        for (dir, requireRoot) in directories {
            let directory: FileDescriptor
            do throws(SystemError) {
                directory = try FileDescriptor.open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
            } catch {
                refuse(dir, error.errno == ELOOP || error.errno == ENOTDIR ? "plugin directory is a symbolic link or not a directory"
                       : unsafe "plugin directory cannot be opened (\(String(cString: strerror(error.errno))))")
                continue
            }
            let dfd = directory.rawValue
            let dst: stat
            do throws(SystemError) { dst = try directory.status(path: dir) } catch {
                refuse(dir, unsafe "plugin directory cannot be examined (\(String(cString: strerror(error.errno))))")
                continue
            }
            if let p = StrictModes.problem(dst, what: "plugin directory", requireRoot: requireRoot)
                ?? (dir.hasPrefix("/") ? StrictModes.ancestorProblem(of: dir, requireRoot: requireRoot) : "plugin directory path is not absolute") {
                refuse(dir, p)
                continue
            }
            for entry in directory.directoryEntries() where entry.hasSuffix(".so") && !entry.hasPrefix(".") {
                let file = dir + "/" + entry
                switch loadOne(dirFD: dfd, entry: entry, file: file, stateRoot: stateRoot, requireRoot: requireRoot,
                               loaded: result.plugins.map(\.name), keepOpen: &keepOpen) {
                case .success(let plugin):
                    result.plugins.append(plugin)
                    hostLog("loaded \(file) as plugin \(plugin.name)")
                case .failure(let reason):
                    refuse(file, reason.text)
                }
            }
        }
        return result
    }

    struct Refusal: Error { let text: String; init(_ t: String) { text = t } }

    static func loadOne(dirFD: Int32, entry: String, file: String, stateRoot: String, requireRoot: Bool, loaded: [String],
                        keepOpen: inout [Int32]) -> Result<LoadedPlugin, Refusal> {
        var lst = stat()
        guard (try? Syscall.retrying("fstatat", file) { unsafe fstatat(dirFD, entry, &lst, AT_SYMLINK_NOFOLLOW) }) != nil else {
            return .failure(Refusal("cannot be examined"))
        }
        if lst.st_mode & S_IFMT == S_IFLNK { return .failure(Refusal("is a symbolic link")) }
        let opened: FileDescriptor
        do throws(SystemError) { opened = try FileDescriptor.open(at: dirFD, entry, O_RDONLY | O_NOFOLLOW, path: file) } catch {
            return .failure(Refusal(unsafe "cannot be opened (\(String(cString: strerror(error.errno))))"))
        }
        let st: stat
        do throws(SystemError) { st = try opened.status(path: file) } catch {
            return .failure(Refusal(unsafe "cannot be examined (\(String(cString: strerror(error.errno))))"))
        }
        // Kept open until loading ends: `/proc/self/fd/N` names stay distinct for glibc's loaded-library list.
        let fd = opened.release()
        keepOpen.append(fd)
        guard st.st_mode & S_IFMT == S_IFREG else { return .failure(Refusal("is not a regular file")) }
        if let p = StrictModes.problem(st, what: "file", requireRoot: requireRoot) { return .failure(Refusal(p)) }
        _ = unsafe dlerror()
        guard let handle = unsafe dlopen("/proc/self/fd/\(fd)", RTLD_NOW | RTLD_LOCAL) else {
            let why = unsafe dlerror().map { unsafe String(cString: $0) } ?? "unknown error"
            // dlerror names the /proc path; say only why.
            let short = why.split(separator: ":").last.map { $0.trimmingCharacters() } ?? why
            return .failure(Refusal("dlopen failed: \(short)"))
        }
        var keep = false
        defer { if !keep { unsafe dlclose(handle) } }
        guard let sym = unsafe dlsym(handle, COFFER_PLUGIN_ENTRY_SYMBOL) else {
            return .failure(Refusal("no \(COFFER_PLUGIN_ENTRY_SYMBOL) symbol (not a Coffer plugin)"))
        }
        let entryFn = unsafe unsafeBitCast(sym, to: coffer_plugin_entry_fn.self)
        guard let raw = unsafe entryFn() else { return .failure(Refusal("\(COFFER_PLUGIN_ENTRY_SYMBOL) returned NULL")) }
        // Read the version and size before anything else: a table of another version may be shorter.
        let header = unsafe UnsafeRawPointer(raw)
        let abi = unsafe header.loadUnaligned(as: UInt32.self), size = unsafe header.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        guard abi == UInt32(COFFER_PLUGIN_ABI_VERSION) else {
            return .failure(Refusal("ABI version \(abi), this host speaks \(COFFER_PLUGIN_ABI_VERSION)"))
        }
        guard unsafe Int(size) >= MemoryLayout<coffer_plugin_v1>.size else {
            return .failure(Refusal(unsafe "table size \(size) is smaller than coffer_plugin_v1 (\(MemoryLayout<coffer_plugin_v1>.size))"))
        }
        let t = unsafe raw.pointee
        guard let cname = unsafe t.name, let name = unsafe String(validatingCString: cname), validName(name) else {
            return .failure(Refusal("the plugin name is missing or not [A-Za-z0-9._-]{1,64}"))
        }
        guard !loaded.contains(name) else { return .failure(Refusal("a plugin named \(name) is already loaded")) }
        guard unsafe (1...4).contains(t.kind) else { return .failure(Refusal(unsafe "unknown kind \(t.kind)")) }
        guard unsafe t.capabilities & ~UInt32(COFFER_CAP_ALL) == 0 else { return .failure(Refusal("undefined capability bits")) }
        guard unsafe t.begin_evaluation != nil, let initFn = unsafe t.`init` else {
            return .failure(Refusal("init or begin_evaluation is NULL"))
        }
        let dir = stateRoot + "/" + name
        do { try Files.makePrivateDirectory(dir) } catch {
            return .failure(Refusal("its state directory cannot be made (\(error))"))
        }
        let host = UnsafeMutablePointer<coffer_host_v1>.allocate(capacity: 1)
        let context = unsafe Unmanaged.passRetained(LogContext(name: name)).toOpaque()
        unsafe host.initialize(to: coffer_host_v1(
            abi_version: UInt32(COFFER_PLUGIN_ABI_VERSION), struct_size: UInt32(MemoryLayout<coffer_host_v1>.size),
            log: { ctx, level, message in
                guard let ctx = unsafe ctx, let message = unsafe message else { return }
                let name = unsafe Unmanaged<LogContext>.fromOpaque(ctx).takeUnretainedValue().name
                let levels = ["error", "warning", "info", "debug"]
                hostLog(unsafe "plugin \(name) [\(levels.indices.contains(Int(level)) ? levels[Int(level)] : "info")]: \(String(cString: message))")
            },
            host_context: unsafe context, state_dir: unsafe strdup(dir)))
        var state: UnsafeMutableRawPointer? = nil
        let rc = unsafe initFn(host, &state)
        guard rc == 0 else {
            unsafe free(UnsafeMutableRawPointer(mutating: host.pointee.state_dir))
            unsafe host.deallocate()
            unsafe Unmanaged<LogContext>.fromOpaque(context).release()
            return .failure(Refusal("init failed (status \(rc))"))
        }
        keep = true
        keepOpen.removeLast() // the loaded library's descriptor stays open for the life of the process
        return unsafe .success(LoadedPlugin(name: name, file: file, table: raw, state: state, host: host))
    }

    static func validName(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.count <= Int(COFFER_PLUGIN_NAME_MAX) && !s.hasPrefix(".")
            && s.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5a) || ($0 >= 0x61 && $0 <= 0x7a) || $0 == 0x2e || $0 == 0x5f || $0 == 0x2d }
    }
}

extension Substring {
    func trimmingCharacters() -> String {
        String(drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
    }
}
