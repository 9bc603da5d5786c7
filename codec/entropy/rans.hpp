// Static-table interleaved rANS for quantized KV symbols (internal to the codec).
//
// A coded matrix is `rows` x `cols` int8 symbols in row-major order. Symbol i goes
// to lane (i mod RANS_LANES); column c is coded with table table_of_col[c] out of a
// small shared set (RansTables). The tables are static: they come from the offline
// profile and never travel in the bitstream.
//
// Values a table does not cover (outside [-R, R], zero frequency, or -128) are coded
// as an ESCAPE symbol followed by the raw byte in a side stream, so encoding never
// fails on any int8 input.
//
// Coded-matrix format (all little-endian), see docs/entropy-coding.md:
//   [0]  u8  version (1)        [1] u8 lanes (32)   [2] u8 PROB_BITS   [3] u8 0
//   [4]  u32 n_words            [8] u32 n_escapes
//   [12] n_words x u16 renormalisation words, in decoder read order
//        n_escapes x u8 raw escaped values, in symbol order
//        lanes x u32 final encoder states (the decoder's start states)
// The states sit at the end on purpose: they give the decoder >= 128 readable bytes
// past the word stream, so the SIMD loops can load a whole step's worth of words
// (64 bytes) without a per-word bounds check.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream::codec {

/// Probability precision: every table's frequencies sum to 2^PROB_BITS. Part of the
/// format (recorded in stream and table headers). 11 bits keeps one decode table at
/// 8 KiB, so 64 tables stay inside a 1 MiB L2; output is ~0.25% above the entropy,
/// ~0.15% more than with 12 bits (measured, see docs/entropy-coding.md).
inline constexpr int PROB_BITS = 11;
inline constexpr uint32_t PROB_SCALE = 1u << PROB_BITS;

/// Interleaved rANS states per coded matrix. Part of the format. 32 = two AVX-512
/// vectors or four AVX2 vectors per step, which hides the gather latency.
inline constexpr int RANS_LANES = 32;

/// Largest table count a RansTables may hold (table ids are bytes).
inline constexpr size_t RANS_MAX_TABLES = 256;

/// Fixed bytes of a coded matrix besides its words and escapes (header + states).
inline constexpr size_t RANS_OVERHEAD_BYTES = 12 + 4 * RANS_LANES;

/// A normalized static frequency table over int8 values [-R, R] plus ESCAPE.
/// Invariants: frequencies sum to PROB_SCALE, escape_freq() >= 1, R <= 127.
class FreqTable {
 public:
  /// Builds a table from a histogram. `counts` has 256 entries: counts[v + 128] is
  /// the count of value v in [-128, 127]. Values with |v| > max_abs, and -128, are
  /// folded into the escape. Every value with a nonzero count gets a nonzero
  /// frequency; the escape always gets >= 1. Integer-only, hence deterministic on
  /// every platform. Errors: invalid_argument for a wrong size, max_abs outside
  /// [0, 127], or no count inside [-max_abs, max_abs].
  static Result<FreqTable> from_counts(std::span<const uint64_t> counts, int max_abs = 127);

  /// Parses a table written by serialize(). With `consumed` null the span must hold
  /// exactly one table; otherwise trailing bytes are allowed and *consumed receives
  /// the table's size. Errors: corrupt_data (bad version, PROB_BITS mismatch, R > 127,
  /// truncated, sum != PROB_SCALE, zero escape frequency).
  static Result<FreqTable> deserialize(std::span<const uint8_t> bytes, size_t* consumed = nullptr);

  /// Appends the table: u8 version(1), u8 PROB_BITS, u8 R, u8 0, then (2R+1) u16
  /// frequencies for v = -R..R, then u16 escape frequency (little-endian).
  void serialize(std::vector<uint8_t>& out) const;

  /// Frequency of value v (0 means v is coded as an escape).
  [[nodiscard]] uint32_t freq(int v) const noexcept;
  [[nodiscard]] uint32_t escape_freq() const noexcept { return escape_freq_; }
  /// R: the table covers [-R, R].
  [[nodiscard]] int max_abs() const noexcept { return max_abs_; }

  /// Expected coded bits per symbol for a histogram (same layout as from_counts)
  /// under this table, including the 8 raw bits of each escape. Infinity never
  /// occurs: every value is codable.
  [[nodiscard]] double cost_bits(std::span<const uint64_t> counts) const;

  /// Empirical (order-0) entropy of a histogram in bits per symbol; 0 when empty.
  static double entropy_bits(std::span<const uint64_t> counts);

  friend bool operator==(const FreqTable&, const FreqTable&) = default;

 private:
  FreqTable() = default;
  std::array<uint16_t, 255> freq_{};  // index v + 127, v in [-127, 127]
  uint16_t escape_freq_ = 0;
  int max_abs_ = 0;
};

/// A set of FreqTables prepared for coding: per table a 2^PROB_BITS-entry decode
/// lookup table (8 KiB) and a 256-entry encode table (4 KiB). Immutable once built
/// and safe to share between threads.
class RansTables {
 public:
  /// Errors: invalid_argument when empty or more than RANS_MAX_TABLES tables.
  static Result<RansTables> build(std::span<const FreqTable> tables);

  [[nodiscard]] size_t size() const noexcept { return num_tables_; }

  /// Decode entry layout (one u32 per slot): bits 0-7 symbol byte (0x80 = escape),
  /// bits 8..8+PROB_BITS-1 slot - start, top bits frequency.
  [[nodiscard]] const uint32_t* decode_table() const noexcept { return dec_.data(); }

  struct EncEntry {
    uint64_t rcp;     // floor((2^64-1)/freq)+1 (0 for freq 1): x/freq == mulhi64(x, rcp) for 32-bit x
    uint32_t freq;    // frequency of the coded symbol (the escape's for escapes)
    uint16_t start;   // cumulative frequency
    uint16_t escape;  // 1 when the value is coded as escape + raw byte
  };
  /// 256 entries per table, indexed by the value's byte (uint8_t(v)).
  [[nodiscard]] const EncEntry* encode_table() const noexcept { return enc_.data(); }

 private:
  RansTables() = default;
  size_t num_tables_ = 0;
  std::vector<uint32_t> dec_;
  std::vector<EncEntry> enc_;
};

/// Decoder implementations. All produce identical output for identical input.
enum class RansPath : uint8_t { automatic, scalar, avx2, avx512 };

/// Whether `path` can run on this CPU (automatic and scalar always can).
bool rans_path_available(RansPath path) noexcept;
/// The path `automatic` resolves to on this CPU.
RansPath rans_best_path() noexcept;
/// "scalar", "avx2", "avx512" or "automatic".
const char* rans_path_name(RansPath path) noexcept;

/// Encodes `rows` x `cols` row-major symbols and appends one coded matrix to `out`.
/// table_of_col.size() must equal cols and every id must be < tables.size().
/// Any int8 value is accepted. Errors (out untouched): invalid_argument for bad
/// shapes or ids, out_of_range when rows*cols exceeds 2^32 - 1.
Status rans_encode(const RansTables& tables, std::span<const uint8_t> table_of_col, const int8_t* symbols,
                   size_t rows, size_t cols, std::vector<uint8_t>& out);

/// Total size of the coded matrix that starts at in[0], read from its header (for
/// framing several matrices in one buffer). Errors: corrupt_data.
Result<size_t> rans_coded_size(std::span<const uint8_t> in);

/// Decodes one coded matrix. `in` must be exactly the bytes rans_encode appended;
/// `symbols_out` receives rows*cols symbols (no alignment or padding needed).
/// Treats `in` as untrusted: truncated, oversized or corrupt input yields
/// corrupt_data without any out-of-bounds access; corruption is also detected by
/// checking that every lane returns to its initial state. On error the content of
/// symbols_out is unspecified. Stateless and allocation-free: any thread may decode
/// any matrix concurrently. Errors: invalid_argument (shape/ids, as rans_encode),
/// unsupported (forced path not available here), corrupt_data.
Status rans_decode(const RansTables& tables, std::span<const uint8_t> table_of_col, std::span<const uint8_t> in,
                   int8_t* symbols_out, size_t rows, size_t cols, RansPath path = RansPath::automatic);

/// One coded matrix of a group (the arguments of rans_decode).
struct RansJob {
  std::span<const uint8_t> table_of_col;
  std::span<const uint8_t> in;
  int8_t* symbols_out = nullptr;
  size_t rows = 0, cols = 0;
};

/// Decodes up to 16 coded matrices that share `tables`, each exactly as rans_decode
/// would. Matrices with the same symbol count are decoded interleaved (up to four at a
/// time with AVX-512, two with AVX2): a single stream is bound by the latency of its
/// state updates, and independent streams fill the gaps, so a group decodes faster
/// than its matrices one by one. Errors: as rans_decode, with the failing job's index;
/// invalid_argument for more than 16 jobs. On error every output is unspecified.
Status rans_decode_group(const RansTables& tables, std::span<const RansJob> jobs, RansPath path = RansPath::automatic);

/// Called by rans_decode_chain for symbols [begin, end) of job `job`: before they are
/// decoded (`decoded` false: fill their table ids) and after (`decoded` true: read
/// them).
using RansChainHook = std::function<void(size_t job, size_t begin, size_t end, bool decoded)>;

/// Decodes one-row matrices (rows 1) of one length whose table ids are known only as
/// decoding goes: job j's ids over a range may depend on job j - 1's symbols over the
/// same range (the refinement layers of a progressive stream, each refining the
/// indices the previous one left). The jobs run as a wavefront, `block` symbols apart:
/// job j decodes a block while job j - 1 decodes the next, interleaved as
/// rans_decode_group interleaves matrices, so a chain of single streams is not bound
/// by one stream's latency. `hook(j, b, e, false)` comes after `hook(j - 1, b, e,
/// true)` and before `hook(j, b, e, true)`; ranges are whole blocks (the last may be
/// shorter). Where the jobs cannot run interleaved (no AVX-512 or AVX2, a length that
/// is not a multiple of 32, `block` not a multiple of 32, escapes in a stream) they run
/// one after another over the whole length, with the same hook order and the same
/// output. The job's `table_of_col` is where its ids are to be written (cols
/// entries); symbols go to `symbols_out`. Errors: as rans_decode_group, with the
/// failing job's index. On error the outputs, and what the hook did with them, are
/// unspecified.
Status rans_decode_chain(const RansTables& tables, std::span<const RansJob> jobs, size_t block,
                         const RansChainHook& hook, RansPath path = RansPath::automatic);

}  // namespace kvstream::codec
