// Placeholder so the tokenizer library has a source until the tokenizer lands.
namespace deepinfer::tokenizer_detail { int placeholder = 0; }
