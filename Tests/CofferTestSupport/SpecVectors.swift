import Foundation

/// The ```vector blocks (or the blocks fenced ```\(fence)) of a spec article (DocC Markdown under
/// `Sources/`), each as its `key: value` lines in a dictionary, in document order; lines that are not
/// `key: value` are skipped. For test suites that check a spec's vectors, so the document and the
/// code cannot drift apart.
public func specVectorBlocks(_ articlePath: String, fence: String = "vector") -> [[String: String]] {
    let text = (try? String(contentsOfFile: packageRootPath() + "/" + articlePath, encoding: .utf8)) ?? ""
    var out: [[String: String]] = []
    var current: [String: String]? = nil
    for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
        if line == "```" + fence { current = [:]; continue }
        guard current != nil else { continue }
        if line == "```" { out.append(current!); current = nil; continue }
        let parts = line.split(separator: ":", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
        if parts.count == 2 { current![parts[0]] = parts[1] }
    }
    return out
}

/// The bytes of a hex string (spaces ignored); nil if it is not hex.
public func hexDecode(_ s: String) -> [UInt8]? {
    let digits = Array(s.utf8.filter { $0 != UInt8(ascii: " ") })
    guard digits.count % 2 == 0 else { return nil }
    var out: [UInt8] = []
    out.reserveCapacity(digits.count / 2)
    for i in stride(from: 0, to: digits.count, by: 2) {
        guard let b = UInt8(String(decoding: digits[i..<i + 2], as: UTF8.self), radix: 16) else { return nil }
        out.append(b)
    }
    return out
}

/// The package's root directory (three levels above this file).
func packageRootPath(file: String = #filePath) -> String {
    URL(fileURLWithPath: file).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
}
