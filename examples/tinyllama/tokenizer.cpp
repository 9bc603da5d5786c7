// SentencePiece-BPE encoding as llama2.c does it (dummy prefix, UTF-8 characters,
// byte fallback, repeatedly merge the best-scoring adjacent pair, leftmost on ties),
// done with a heap and a linked list so the whole eval text encodes in milliseconds.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <queue>

#include "examples/tinyllama/tinyllama.hpp"

namespace tinyllama {

using kvstream::make_status;
using kvstream::StatusCode;

std::string data_dir(std::string_view explicit_dir) {
  if (!explicit_dir.empty()) return std::string(explicit_dir);
  if (const char* env = std::getenv("KVSTREAM_TINYLLAMA"); env && *env) return env;
  return "../shared/data/tinyllama";
}

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_status(StatusCode::not_found, "cannot open tokenizer '{}'", path);
  int32_t max_len = 0;
  if (!f.read(reinterpret_cast<char*>(&max_len), 4) || max_len <= 0 || max_len > 1024)
    return make_status(StatusCode::corrupt_data, "tokenizer '{}': bad header", path);
  Tokenizer t;
  // The vocabulary size is not in the file: read records until the end.
  for (;;) {
    float score;
    int32_t len;
    if (!f.read(reinterpret_cast<char*>(&score), 4)) break;
    if (!f.read(reinterpret_cast<char*>(&len), 4) || len < 0 || len > max_len * 4 + 16)
      return make_status(StatusCode::corrupt_data, "tokenizer '{}': bad record {}", path, t.pieces_.size());
    std::string piece(size_t(len), '\0');
    if (len > 0 && !f.read(piece.data(), len))
      return make_status(StatusCode::corrupt_data, "tokenizer '{}': truncated record {}", path, t.pieces_.size());
    t.ids_.emplace(piece, int(t.pieces_.size()));  // first occurrence wins
    t.pieces_.push_back(std::move(piece));
    t.scores_.push_back(score);
  }
  if (t.pieces_.size() < 259)
    return make_status(StatusCode::corrupt_data, "tokenizer '{}': {} pieces, fewer than the 259 byte tokens need",
                       path, t.pieces_.size());
  return t;
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int>& out) const {
  struct Sym {
    int id;
    int prev, next;
    std::string str;
  };
  std::vector<Sym> syms;
  for (size_t i = 0; i < text.size();) {
    // Length of this UTF-8 character (continuation bytes are 10xxxxxx).
    size_t len = 1;
    while (i + len < text.size() && len < 4 && (uint8_t(text[i + len]) & 0xC0) == 0x80) ++len;
    std::string ch(text.substr(i, len));
    if (auto it = ids_.find(ch); it != ids_.end()) {
      syms.push_back({it->second, 0, 0, std::move(ch)});
    } else {
      // Byte tokens carry their "<0xNN>" piece, so (as in llama2.c) they never merge.
      for (char b : ch) syms.push_back({int(uint8_t(b)) + 3, 0, 0, pieces_[size_t(uint8_t(b)) + 3]});
    }
    i += len;
  }
  const int n = int(syms.size());
  for (int i = 0; i < n; ++i) syms[i].prev = i - 1, syms[i].next = i + 1 < n ? i + 1 : -1;
  struct Cand {
    float score;
    int left, right;  // symbol indices; stale when either changed since
    int id;
    size_t lsize, rsize;
  };
  auto worse = [](const Cand& a, const Cand& b) {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;  // leftmost first on ties
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto consider = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    auto it = ids_.find(syms[l].str + syms[r].str);
    if (it == ids_.end()) return;
    heap.push({scores_[it->second], l, r, it->second, syms[l].str.size(), syms[r].str.size()});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
  std::vector<bool> dead(size_t(n), false);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (dead[c.left] || dead[c.right] || syms[c.left].next != c.right || syms[c.left].str.size() != c.lsize ||
        syms[c.right].str.size() != c.rsize)
      continue;
    Sym& l = syms[c.left];
    l.str += syms[c.right].str;
    l.id = c.id;
    dead[c.right] = true;
    l.next = syms[c.right].next;
    if (l.next >= 0) syms[l.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
  for (int i = 0; i < n; ++i)
    if (!dead[i]) out.push_back(syms[i].id);
}

std::vector<int> Tokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<int> out;
  if (bos) out.push_back(kBos);
  // Byte tokens never merge and "\n" has no piece, so each line encodes on its own;
  // only the first line carries the dummy prefix.
  std::string first = " ";
  size_t start = 0;
  bool at_start = true;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(start, end - start);
    if (at_start) {
      if (!text.empty()) encode_segment(first + std::string(line), out);
      at_start = false;
    } else {
      encode_segment(line, out);
    }
    if (nl == std::string_view::npos) break;
    out.push_back('\n' + 3);
    start = nl + 1;
  }
  if (eos) out.push_back(kEos);
  return out;
}

Result<std::string> Tokenizer::decode(int prev, int token) const {
  if (token < 0 || token >= int(pieces_.size()))
    return make_status(StatusCode::invalid_argument, "token id {} outside the vocabulary [0, {})", token,
                       pieces_.size());
  std::string_view piece = pieces_[token];
  if (prev == kBos && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  unsigned byte = 0;
  if (piece.size() == 6 && std::sscanf(std::string(piece).c_str(), "<0x%02X>", &byte) == 1)
    return std::string(1, char(byte));
  return std::string(piece);
}

Result<std::string> Tokenizer::decode_all(std::span<const int> tokens) const {
  std::string s;
  int prev = kBos;
  for (int t : tokens) {
    KVS_ASSIGN_OR_RETURN(std::string p, decode(prev, t));
    s += p;
    prev = t;
  }
  return s;
}

Result<std::string> read_eval_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_status(StatusCode::not_found, "cannot open eval text '{}'", path);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\n' && i + 1 < raw.size() && raw[i + 1] == '\n') {
      out += '\n';
      ++i;
      continue;
    }
    out += raw[i];
  }
  // The file ends with a story's "\n\n"; the scored text ends with the story itself.
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace tinyllama
