public import Foundation

/// A private temporary directory removed when released.
public final class TemporaryDirectory: @unchecked Sendable {
    /// Its absolute path.
    public let path: String

    /// Creates `/tmp/coffer-test-XXXXXX` (mode 0700).
    public init(_ prefix: String = "coffer-test") {
        var template = Array("\(NSTemporaryDirectory())/\(prefix)-XXXXXX".utf8CString)
        let p = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(p != nil, "mkdtemp failed")
        path = String(cString: p!)
    }

    /// `path/name`.
    public func file(_ name: String) -> String { path + "/" + name }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// Reads a file's bytes ([] if missing).
public func fileBytes(_ path: String) -> [UInt8] {
    (try? Data(contentsOf: URL(fileURLWithPath: path))).map { [UInt8]($0) } ?? []
}

/// Writes bytes to a file, replacing it.
public func writeFileBytes(_ path: String, _ bytes: [UInt8]) {
    _ = FileManager.default.createFile(atPath: path, contents: Data(bytes))
}

/// True if `needle` occurs anywhere in `haystack`.
public func containsSubsequence(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
    guard !needle.isEmpty, haystack.count >= needle.count else { return false }
    let first = needle[0]
    var i = 0
    while i <= haystack.count - needle.count {
        if haystack[i] == first && Array(haystack[i..<i + needle.count]) == needle { return true }
        i += 1
    }
    return false
}

/// Monotonic time in milliseconds.
public func nowMillis() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) * 1000 + Double(ts.tv_nsec) / 1e6
}

/// The inputs `contrib/fuzz/run` saved for a test target (its seeds, and any input that ever crashed
/// the target): the `.bin` files in the `FuzzRegressions` folder beside `file`, in name order.
public func fuzzRegressionInputs(besideFile file: String = #filePath) -> [URL] {
    let dir = URL(fileURLWithPath: file).deletingLastPathComponent().appendingPathComponent("FuzzRegressions")
    return ((try? FileManager.default.contentsOfDirectory(at: dir, includingPropertiesForKeys: nil)) ?? [])
        .filter { $0.pathExtension == "bin" }.sorted { $0.path < $1.path }
}
