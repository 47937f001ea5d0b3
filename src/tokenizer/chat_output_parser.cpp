// ChatOutputParser: reasoning → content → DSML tool calls, as a chat-completions server uses it.
#include "tokenizer/parsers.h"

namespace deepinfer::parsers {

namespace {
std::vector<std::string> block_openers(Family family) {
  auto d = DsmlDialect::for_family(family);
  return {"\n\n" + d.block_open, d.block_open};
}
}  // namespace

ChatOutputParser::ChatOutputParser(Family family, bool thinking, ToolCallParser::IdGenerator id_gen)
    : reasoning_(thinking, block_openers(family)), tools_(family, std::move(id_gen), {std::string(kThinkEnd)}) {}

ChatOutputParser::Deltas ChatOutputParser::feed(std::string_view chunk) {
  auto r = reasoning_.feed(chunk);
  auto t = tools_.feed(r.content);
  return {std::move(r.reasoning), std::move(t.content), std::move(t.tool_calls)};
}

ChatOutputParser::Deltas ChatOutputParser::finish() {
  auto r = reasoning_.finish();
  auto t = tools_.feed(r.content);
  auto t2 = tools_.finish();
  t.content += t2.content;
  for (auto& c : t2.tool_calls) t.tool_calls.push_back(std::move(c));
  return {std::move(r.reasoning), std::move(t.content), std::move(t.tool_calls)};
}

}  // namespace deepinfer::parsers
