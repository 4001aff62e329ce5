import CofferCrypto
import CofferModel
import CofferSSHAgentProtocol
import CofferSystem
import Glibc

/// `coffer ssh import`'s way of reading a private key file: OpenSSH's own `ssh-add` reads it (every
/// format OpenSSH reads, encrypted ones with their passphrase asked on the terminal or through
/// SSH_ASKPASS) and hands the key to this process, which poses as an agent for that one `ssh-add` on
/// a socket in a new private directory (0700, removed after). Coffer parses no key file format and
/// derives no passphrase key of its own; the key travels over the socket in the ssh-agent wire form
/// and lands in secure memory.
enum SSHAddHandOver {
    /// The environment `ssh-add` keeps (what its passphrase prompt needs); nothing else of this process's.
    static let keptEnvironment = ["HOME", "PATH", "TERM", "LANG", "LC_ALL", "LC_CTYPE", "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY",
                                  "SSH_ASKPASS", "SSH_ASKPASS_REQUIRE"]
    /// How long `ssh-add` may take, passphrase prompt included.
    static let timeoutSeconds = 300.0

    /// The key in `file` in the ssh-agent wire form (secure memory) and its comment.
    static func key(fromFile file: String) throws(SecError) -> (SecureBytes, String) {
        guard let sshAdd = Subprocess.find("ssh-add") else {
            throw .notAvailable("ssh-add (OpenSSH's client) is not installed; coffer ssh import uses it to read the key file")
        }
        guard Files.exists(file) else { throw .param("no such key file") }
        let base = ThisProcess.environment(["XDG_RUNTIME_DIR"])["XDG_RUNTIME_DIR"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? "/tmp"
        var template = Array((base + "/coffer-import-XXXXXX").utf8CString)
        guard let dir = unsafe template.withUnsafeMutableBufferPointer({ p in unsafe mkdtemp(p.baseAddress!).map { unsafe String(cString: $0) } }) else {
            throw SecError(.io, "cannot make a private directory in \(base): \(String(cString: strerror(errno)))")
        }
        let socketPath = dir + "/agent.sock"
        defer { unlink(socketPath); rmdir(dir) }
        let listener: Int32
        do { listener = try UnixSocket.listen(path: socketPath, backlog: 4) } catch { throw SecError(.io, "import socket: \(error)") }
        defer { close(listener) }
        var environment = ["SSH_AUTH_SOCK=\(socketPath)"]
        for (k, v) in ThisProcess.environment(keptEnvironment) { environment.append("\(k)=\(v)") }
        let child: Subprocess.Child
        do {
            // The pair's end on descriptor 3 is unused by ssh-add; it closes with it.
            child = try Subprocess.spawn(executable: sshAdd, arguments: ["-q", file], environment: environment)
        } catch {
            throw SecError(.io, "cannot start ssh-add: \(error)")
        }
        var captured: (SecureBytes, String)? = nil
        let deadline = Threads.monotonicSeconds() + timeoutSeconds
        var status: Int32? = nil
        while status == nil {
            var raw: Int32 = 0
            if waitpid(child.pid, &raw, WNOHANG) == child.pid {
                status = (raw & 0x7f) == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
                break
            }
            if Threads.monotonicSeconds() > deadline {
                kill(child.pid, SIGKILL)
                _ = try? child.wait()
                captured?.0.wipe()
                throw SecError(.io, "ssh-add did not finish within \(Int(timeoutSeconds)) s")
            }
            guard (try? Poll.readable([listener], timeoutMillis: 100))?.first == true,
                  let conn = try? UnixSocket.accept(listener) else { continue }
            defer { close(conn) }
            // Only ssh-add itself (the same user; its pid) may hand a key over.
            guard let peer = try? PeerIdentity.of(socket: conn), peer.uid == geteuid(), peer.pid == child.pid else { continue }
            serve(conn, captured: &captured)
        }
        guard let captured else {
            throw .param("ssh-add handed over no key (exit status \(status ?? -1)): see its message above (a wrong passphrase, a file that is not a private key)")
        }
        return captured
    }

    /// Answers one ssh-add connection: the first plain ADD_IDENTITY is taken (SUCCESS); a listing
    /// gets an empty one; everything else (a certificate, a constraint) gets FAILURE.
    private static func serve(_ conn: Int32, captured: inout (SecureBytes, String)?) {
        while var body = readFrame(conn) {
            defer { secureZero(&body) }
            let reply: SSHAgentReply
            switch try? SSHAgentRequest.decode(body: body) {
            case .requestIdentities?:
                reply = .identities([])
            case .addIdentity(let key, let comment, let constraints)? where constraints.isEmpty && captured == nil:
                captured = (key.encodeWire(), comment)
                reply = .success
            default:
                reply = .failure
            }
            guard let frame = try? reply.encodeFrame(), frame.withUnsafeBytes({ StandardStreams.write(conn, $0) }) else { return }
        }
    }

    /// One frame's body, or nil at the end of the connection or on a malformed length.
    private static func readFrame(_ conn: Int32) -> [UInt8]? {
        var prefix = [UInt8](repeating: 0, count: 4)
        guard readFully(conn, &prefix), let n = try? SSHAgentFraming.bodyLength(prefix: prefix) else { return nil }
        var body = [UInt8](repeating: 0, count: n)
        guard readFully(conn, &body) else { secureZero(&body); return nil }
        return body
    }

    private static func readFully(_ fd: Int32, _ buffer: inout [UInt8]) -> Bool {
        var done = 0
        while done < buffer.count {
            let n = unsafe buffer.withUnsafeMutableBytes { p in unsafe read(fd, p.baseAddress! + done, p.count - done) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }
            done += n
        }
        return true
    }
}
