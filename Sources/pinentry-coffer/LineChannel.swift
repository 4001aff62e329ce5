import CofferClient
import CofferCrypto
import CofferPrompt
import CofferSystem
import Glibc

/// One side of an Assuan conversation: lines in (read into secure memory, since a `D` line may carry
/// a pin) and lines out. `input` and `output` are the same descriptor for the wrapped pinentry's
/// socket, 0 and 1 for gpg-agent.
final class LineChannel {
    let input: Int32
    let output: Int32
    /// The longest line taken (Assuan allows 1000 bytes; this leaves room for sloppy peers).
    static let bufferBytes = 16384
    /// What ``takeLine()`` hands over for a longer line, which is dropped up to its LF (never cut in
    /// two, its tail taken for a line of its own): GPG_ERR_ASS_LINE_TOO_LONG. From the wrapped
    /// pinentry it is that pinentry's failure; from gpg-agent, a command nobody knows, answered ERR.
    static let tooLong = "ERR 83886343 Line too long <Pinentry>"
    private let buffer = SecureBytes(count: LineChannel.bufferBytes)
    private var filled = 0
    /// Dropping the rest of a line that was too long, up to its LF.
    private var discarding = false

    init(input: Int32, output: Int32) {
        self.input = input
        self.output = output
    }

    deinit { buffer.wipe() }

    /// The next whole line (without LF, and without a CR before it), waiting for it; nil at end of
    /// input or on an error.
    func readLine() -> SecureBytes? {
        while true {
            if let line = takeLine() { return line }
            guard fill() else { return nil }
        }
    }

    /// Reads once what is there (after poll said so); false at end of input or on an error.
    func fill() -> Bool {
        // A full buffer without LF: ``takeLine()`` drops it and hands over ``tooLong``.
        if filled == buffer.count { return true }
        while true {
            let n = buffer.withUnsafeMutableBytes { b in Glibc.read(input, b.baseAddress! + filled, b.count - filled) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            filled += n
            return true
        }
    }

    /// The next complete line already read, consumed from the buffer (nil if none yet).
    func takeLine() -> SecureBytes? {
        buffer.withUnsafeMutableBytes { b -> SecureBytes? in
            func drop(_ count: Int) {
                let rest = filled - count
                if rest > 0 { memmove(b.baseAddress!, b.baseAddress! + count, rest) }
                memset(b.baseAddress! + rest, 0, filled - rest)
                filled = rest
            }
            if discarding {
                guard let nl = (0..<filled).first(where: { b[$0] == 0x0A }) else { drop(filled); return nil }
                drop(nl + 1)
                discarding = false
            }
            guard let nl = (0..<filled).first(where: { b[$0] == 0x0A }) else {
                guard filled == b.count else { return nil }
                drop(filled)
                discarding = true
                var text = Array(Self.tooLong.utf8)
                return SecureBytes(consuming: &text)
            }
            var end = nl
            let next = nl + 1
            if end > 0 && b[end - 1] == 0x0D { end -= 1 }
            let line = SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[0..<end]))
            drop(next)
            return line
        }
    }

    /// Writes `line` and LF; false if the peer is gone.
    @discardableResult
    func send(_ line: String) -> Bool {
        var s = line + "\n"
        return s.withUTF8 { StandardStreams.write(output, UnsafeRawBufferPointer($0)) }
    }

    /// Writes `line` (secure memory, e.g. a `D` line being forwarded) and LF.
    @discardableResult
    func send(_ line: SecureBytes) -> Bool {
        let ok = line.withUnsafeBytes { StandardStreams.write(output, $0) }
        return ok && send("")
    }

    /// Writes ready-made bytes (``CofferPrompt/Assuan/dataLines(_:)``: they end in LF).
    @discardableResult
    func sendRaw(_ bytes: SecureBytes) -> Bool {
        bytes.withUnsafeBytes { StandardStreams.write(output, $0) }
    }
}

/// Reading the parts of an Assuan line that are not secret.
enum AssuanLine {
    /// The command or reply keyword (`GETPIN`, `OK`, `D`, …), upper-cased; at most 40 bytes are looked at.
    static func keyword(_ line: SecureBytes) -> String {
        line.withUnsafeBytes { b in
            var out = ""
            for byte in b.prefix(40) {
                if byte == 0x20 || byte == 0x09 { break }
                out.unicodeScalars.append(Unicode.Scalar(byte))
            }
            return out.uppercased()
        }
    }

    /// The whole line as text. Only for lines that carry no secret (commands other than `D`).
    static func text(_ line: SecureBytes) -> String {
        line.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
    }

    /// What follows the keyword and its spaces.
    static func argument(_ text: String) -> String {
        guard let space = text.firstIndex(where: { $0 == " " || $0 == "\t" }) else { return "" }
        return String(text[space...].drop { $0 == " " || $0 == "\t" })
    }

    /// True if `line` is a `D` data line (the pin's line).
    static func isData(_ line: SecureBytes) -> Bool {
        line.withUnsafeBytes { b in b.count >= 1 && b[0] == UInt8(ascii: "D") && (b.count == 1 || b[1] == 0x20) }
    }

    /// A `D` line's data, percent-decoded, in secure memory.
    static func data(_ line: SecureBytes) -> SecureBytes {
        line.withUnsafeBytes { b in Assuan.unescape(b, from: min(2, b.count)) }
    }
}
