// Incremental text for streaming: pieces join to the final text, stop strings cut it and never
// leak (even in part), and a partial UTF-8 character waits for the rest.
#include "serve/text_stream.h"

#include <gtest/gtest.h>

#include "data/tokenizer.h"

namespace mt::serve {
namespace {

std::unique_ptr<data::Tokenizer> null_tokenizer() {
  data::TokenizerOptions o;
  o.type = "NullTokenizer";
  o.vocab_size = 1000;
  return data::build_tokenizer(o);
}

TEST(ServeTextStream, PiecesJoinToTheContinuation) {
  auto tok = null_tokenizer();
  TextStream s(*tok, {1, 2}, false, {});
  std::string joined;
  for (int32_t id : {3, 45, 6}) joined += s.push(id);
  joined += s.finish();
  EXPECT_EQ(joined, " 3 45 6");  // the separator after the prompt's "1 2" comes with the first token
  EXPECT_EQ(s.text(), joined);
  EXPECT_FALSE(s.stopped());
}

TEST(ServeTextStream, StopStringCutsAndIsHeldBack) {
  auto tok = null_tokenizer();
  TextStream s(*tok, {1}, false, {" 7 8"});
  EXPECT_EQ(s.push(5), " 5");
  EXPECT_EQ(s.push(7), "");  // " 7" may begin " 7 8": held
  EXPECT_EQ(s.push(8), "");  // the stop string: cut before it
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), " 5");
  EXPECT_EQ(s.push(9), "");
  EXPECT_EQ(s.finish(), "");
}

TEST(ServeTextStream, HeldTextIsReleasedWhenItIsNoStop) {
  auto tok = null_tokenizer();
  TextStream s(*tok, {1}, false, {" 7 8"});
  EXPECT_EQ(s.push(7), "");
  EXPECT_EQ(s.push(9), " 7 9");
  EXPECT_EQ(s.push(7), "");
  EXPECT_EQ(s.finish(), " 7");  // the end releases what was held
  EXPECT_EQ(s.text(), " 7 9 7");
}

TEST(ServeTextStream, Utf8AndStopTails) {
  EXPECT_EQ(incomplete_utf8_tail("ab"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("a\xC3"), 1u);          // 2-byte lead alone
  EXPECT_EQ(incomplete_utf8_tail("a\xC3\xA9"), 0u);      // é complete
  EXPECT_EQ(incomplete_utf8_tail("\xE2\x82"), 2u);       // € missing its last byte
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\x98"), 3u);   // an emoji missing one byte
  EXPECT_EQ(incomplete_utf8_tail("\x80\x80\x80\x80"), 0u);  // invalid: nothing to wait for
  EXPECT_EQ(stop_prefix_tail("hello wor", {"world", "xyz"}), 3u);
  EXPECT_EQ(stop_prefix_tail("hello", {"world"}), 0u);
  EXPECT_EQ(stop_prefix_tail("a\n", {"\n\n"}), 1u);
}

}  // namespace
}  // namespace mt::serve
