#pragma once
// A pickle's stack machine run as torch's unpickler runs it, on values reduced to what the
// checks need. torch 1.13's unpickler trusts a pickle's structure: an opcode that finds too
// few values on its stack or no mark, a string longer than what is left, or a memo index of
// billions is undefined behaviour there (a crash) or gigabytes allocated. This machine stops
// at the first of them, before torch reads the pickle.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <torchloom/detail/pickle_value.hpp>
#include <torchloom/detail/strings.hpp>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The deepest a pickle may nest tuples, lists and dicts: torch frees a nested value
//! recursively, and what torch writes nests a few levels.
inline constexpr std::uint32_t max_pickle_nesting = 1000;

//! Runs a pickle's opcodes, those torch's unpickler reads (protocol 2), and stops at the
//! first that torch would trip on. What torch does with GLOBAL, REDUCE and BUILD, and
//! BINPERSID is the derived class's (on_global, on_call, on_persistent_id), which may stop
//! the run with fail().
class pickle_machine {
 public:
  //! A machine for `bytes`, which must outlive it.
  explicit pickle_machine(std::string_view bytes) : bytes_(bytes) {}
  pickle_machine(const pickle_machine&) = delete;
  pickle_machine& operator=(const pickle_machine&) = delete;
  virtual ~pickle_machine() = default;

  //! Runs the pickle to its STOP: an empty string when it is well formed, else what is wrong
  //! and at which byte ("at byte 3: REDUCE needs 2 values on the stack and finds 1"). An
  //! opcode torch does not read ends the run without a verdict (complete() is false).
  std::string run() {
    try {
      if (bytes_.size() < 2 || bytes_[0] != '\x80') fail("it does not start with PROTO");
      if (bytes_.size() > UINT32_MAX) fail("it is larger than 4 GiB");
      if (bytes_[1] != 2) {
        fail(concat("protocol ", static_cast<int>(bytes_[1]), "; torch reads protocol 2"));
      }
      pos_ = 2;
      while (step()) {
      }
    } catch (const malformed& m) {
      return concat("at byte ", op_at_, ": ", m.what);
    }
    return {};
  }

  //! False when the run stopped at an opcode that torch's unpickler does not read.
  bool complete() const noexcept { return complete_; }

 protected:
  using kind = pickle_value::kind;

  //! Stops the run: the pickle is malformed, as `what` says.
  [[noreturn]] static void fail(std::string what) { throw malformed{std::move(what)}; }

  //! GLOBAL `module`.`name`: pushes what torch pushes.
  virtual void on_global(std::string_view module, std::string_view name) = 0;
  //! REDUCE or BUILD: what torch makes of the global `callee` called on `arg`.
  virtual pickle_value on_call(const pickle_value& callee, const pickle_value& arg) = 0;
  //! BINPERSID of `id`: pushes what torch pushes.
  virtual void on_persistent_id(const pickle_value& id) = 0;
  //! `key`: `value` put into a dict.
  virtual void on_dict_item(const pickle_value& key, const pickle_value& value) {
    (void)key;
    (void)value;
  }

  //! Pushes a value without elements.
  void push_simple(kind k, std::int64_t number = 0, std::string_view text = {}) {
    pickle_value v;
    v.k = k;
    v.number = number;
    if (!text.empty()) {  // a part of the pickle: its offset and length
      v.first = static_cast<std::uint32_t>(text.data() - bytes_.data());
      v.count = static_cast<std::uint32_t>(text.size());
    }
    stack_.push_back(v);
  }

  //! The string of a text or storage_type value.
  std::string_view text_of(const pickle_value& v) const {
    if (v.k != kind::text && v.k != kind::storage_type) return {};
    return bytes_.substr(v.first, v.count);
  }

  //! The elements of the tuple `v` (none for another value); valid until the next push.
  std::span<const pickle_value> elements(const pickle_value& v) const {
    if (v.k != kind::tuple) return {};
    return std::span<const pickle_value>(items_).subspan(v.first, v.count);
  }

  //! How deep `v` nests.
  std::uint16_t depth_of(const pickle_value& v) const {
    if (v.k == kind::list || v.k == kind::dict) {
      return containers_[static_cast<std::size_t>(v.number)];
    }
    return v.depth;
  }

  //! The nesting of a value that holds `v` (at most max_pickle_nesting + 1).
  std::uint16_t next_depth(const pickle_value& v) const {
    return static_cast<std::uint16_t>(depth_of(v) + 1);
  }
  //! Stops the run when `depth` is past max_pickle_nesting.
  static void check_nesting(std::uint32_t depth) {
    if (depth > max_pickle_nesting) {
      fail(concat("values nest more than ", max_pickle_nesting, " deep"));
    }
  }

 private:
  struct malformed {
    std::string what;
  };

  std::uint64_t read(std::size_t n, const char* what) {
    if (bytes_.size() - pos_ < n) fail(concat(what, " runs past the end of the pickle"));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) {
      v |= std::uint64_t{static_cast<unsigned char>(bytes_[pos_ + i])} << (8 * i);
    }
    pos_ += n;
    return v;
  }
  std::string_view read_line(const char* what) {
    const auto end = bytes_.find('\n', pos_);
    if (end == std::string_view::npos) fail(concat(what, " has no end of line"));
    const auto line = bytes_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return line;
  }

  // The values above the last mark: what an opcode may take from the stack.
  std::size_t available() const {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    return stack_.size() > floor ? stack_.size() - floor : 0;
  }
  void need(std::size_t n, const char* op) {
    if (available() < n) {
      fail(concat(op, " needs ", n, " values on the stack and finds ", available()));
    }
  }
  pickle_value pop() {
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::size_t pop_mark(const char* op) {
    if (marks_.empty()) fail(concat(op, " finds no MARK"));
    const std::size_t start = marks_.back();
    marks_.pop_back();
    if (start > stack_.size()) fail(concat(op, " finds its MARK above the stack"));
    return start;
  }

  pickle_value make_container(kind k) {
    pickle_value v;
    v.k = k;
    v.number = static_cast<std::int64_t>(containers_.size());
    containers_.push_back(1);
    return v;
  }
  // Moves stack[start..] into the container `c` (a list, or a dict's keys and values).
  void fill(const pickle_value& c, std::size_t start, const char* op) {
    if (c.k == kind::dict && (stack_.size() - start) % 2 != 0) {
      fail(concat(op, " finds a key without a value"));
    }
    auto& depth = containers_[static_cast<std::size_t>(c.number)];
    for (std::size_t i = start; i < stack_.size(); ++i) {
      depth = static_cast<std::uint16_t>(std::max(depth, next_depth(stack_[i])));
      if (c.k == kind::dict && (i - start) % 2 == 1) on_dict_item(stack_[i - 1], stack_[i]);
    }
    check_nesting(depth);
    stack_.erase(stack_.begin() + static_cast<std::ptrdiff_t>(start), stack_.end());
  }
  // Makes a tuple of the top `n` values.
  void make_tuple(std::size_t n) {
    const auto first = stack_.end() - static_cast<std::ptrdiff_t>(n);
    pickle_value v;
    v.k = kind::tuple;
    v.depth = 1;
    for (auto it = first; it != stack_.end(); ++it) v.depth = std::max(v.depth, next_depth(*it));
    check_nesting(v.depth);
    if (items_.size() + n > UINT32_MAX) fail("the pickle holds too many values");
    v.first = static_cast<std::uint32_t>(items_.size());
    v.count = static_cast<std::uint32_t>(n);
    items_.insert(items_.end(), first, stack_.end());
    stack_.erase(first, stack_.end());
    stack_.push_back(v);
  }
  void memo_put(std::uint64_t id) {
    if (stack_.empty()) fail("BINPUT finds an empty stack");
    // torch fills its memo up to the index; a writer numbers its entries from 0, so an index
    // past the opcodes read so far is no writer's.
    if (id > ops_) fail(concat("memo index ", id, " after only ", ops_, " opcodes"));
    if (id >= memo_.size()) memo_.resize(static_cast<std::size_t>(id) + 1);
    memo_[static_cast<std::size_t>(id)] = stack_.back();
  }
  void memo_get(std::uint64_t id) {
    if (id >= memo_.size()) fail(concat("BINGET of memo index ", id, ", which is not set"));
    stack_.push_back(memo_[static_cast<std::size_t>(id)]);
  }

  // One opcode; false after STOP or an opcode torch does not read.
  bool step() {
    op_at_ = pos_;
    if (pos_ >= bytes_.size()) fail("the pickle ends without its STOP opcode");
    const char op = bytes_[pos_++];
    ++ops_;
    switch (op) {
      case '.':  // STOP
        if (stack_.size() != 1) fail(concat("STOP leaves ", stack_.size(), " values"));
        return false;
      case '(':  // MARK
        marks_.push_back(stack_.size());
        return true;
      case ']':  // EMPTY_LIST
        stack_.push_back(make_container(kind::list));
        return true;
      case '}':  // EMPTY_DICT
        stack_.push_back(make_container(kind::dict));
        return true;
      case ')':  // EMPTY_TUPLE
        make_tuple(0);
        return true;
      case 'N':  // NONE
        push_simple(kind::none);
        return true;
      case '\x88':  // NEWTRUE
      case '\x89':  // NEWFALSE
        push_simple(kind::boolean);
        return true;
      case 'K':  // BININT1
        push_simple(kind::integer, static_cast<std::int64_t>(read(1, "BININT1")));
        return true;
      case 'M':  // BININT2
        push_simple(kind::integer, static_cast<std::int64_t>(read(2, "BININT2")));
        return true;
      case 'J':  // BININT
        push_simple(kind::integer, static_cast<std::int32_t>(read(4, "BININT")));
        return true;
      case '\x8a': {  // LONG1: torch reads 8 bytes only
        const auto n = read(1, "LONG1");
        if (n != 8) fail(concat("LONG1 of ", n, " bytes; torch reads 8"));
        push_simple(kind::integer, static_cast<std::int64_t>(read(8, "LONG1")));
        return true;
      }
      case 'G':  // BINFLOAT
        read(8, "BINFLOAT");
        push_simple(kind::real);
        return true;
      case 'X': {  // BINUNICODE
        const auto n = read(4, "BINUNICODE");
        if (bytes_.size() - pos_ < n) {
          fail(concat("BINUNICODE declares a string of ", n, " bytes where ", bytes_.size() - pos_,
                      " are left"));
        }
        push_simple(kind::text, 0, bytes_.substr(pos_, static_cast<std::size_t>(n)));
        pos_ += static_cast<std::size_t>(n);
        return true;
      }
      case 'q':  // BINPUT
        memo_put(read(1, "BINPUT"));
        return true;
      case 'r':  // LONG_BINPUT
        memo_put(read(4, "LONG_BINPUT"));
        return true;
      case 'h':  // BINGET
        memo_get(read(1, "BINGET"));
        return true;
      case 'j':  // LONG_BINGET
        memo_get(read(4, "LONG_BINGET"));
        return true;
      case 't':  // TUPLE
        make_tuple(stack_.size() - pop_mark("TUPLE"));
        return true;
      case '\x85':    // TUPLE1
      case '\x86':    // TUPLE2
      case '\x87': {  // TUPLE3
        const std::size_t n = static_cast<std::size_t>(op - '\x85') + 1;
        need(n, "TUPLE1, 2 or 3");
        make_tuple(n);
        return true;
      }
      case 'l':    // LIST
      case 'd': {  // DICT
        const char* name = op == 'l' ? "LIST" : "DICT";
        const std::size_t start = pop_mark(name);
        const auto c = make_container(op == 'l' ? kind::list : kind::dict);
        fill(c, start, name);
        stack_.push_back(c);
        return true;
      }
      case 'e':    // APPENDS
      case 'u': {  // SETITEMS
        const char* name = op == 'e' ? "APPENDS" : "SETITEMS";
        const std::size_t start = pop_mark(name);
        if (start == 0 || stack_[start - 1].k != (op == 'e' ? kind::list : kind::dict)) {
          fail(concat(name, " finds no ", op == 'e' ? "list" : "dict", " below its MARK"));
        }
        fill(stack_[start - 1], start, name);
        return true;
      }
      case 's':  // SETITEM
        need(3, "SETITEM");
        if (stack_[stack_.size() - 3].k != kind::dict) fail("SETITEM finds no dict");
        fill(stack_[stack_.size() - 3], stack_.size() - 2, "SETITEM");
        return true;
      case 'c': {  // GLOBAL
        const auto module = read_line("GLOBAL's module");
        const auto name = read_line("GLOBAL's name");
        on_global(module, name);
        return true;
      }
      case '\x81':  // NEWOBJ: torch drops its arguments
        need(1, "NEWOBJ");
        stack_.pop_back();
        return true;
      case 'R':    // REDUCE
      case 'b': {  // BUILD
        need(2, op == 'R' ? "REDUCE" : "BUILD");
        const auto arg = pop();
        const auto callee = pop();
        stack_.push_back(on_call(callee, arg));
        return true;
      }
      case 'Q':  // BINPERSID
        need(1, "BINPERSID");
        on_persistent_id(pop());
        return true;
      default:
        complete_ = false;
        return false;
    }
  }

  std::string_view bytes_;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  std::uint64_t ops_ = 0;
  bool complete_ = true;
  std::vector<pickle_value> stack_;
  std::vector<std::size_t> marks_;
  std::vector<pickle_value> memo_;
  std::vector<std::uint16_t> containers_;  // each list's and dict's nesting, by id
  std::vector<pickle_value> items_;        // every tuple's elements
};

}  // namespace torchloom::detail
