#include "protocol/codec.h"

#include <cstring>

#include "protocol/framing.h"
#include "protocol/op_table.h"

namespace kvtier {

static_assert(static_cast<int>(fb::Status::Internal) == static_cast<int>(StatusCode::kInternal));
static_assert(static_cast<int>(fb::Status::MAX) == kMaxStatusCode);
static_assert(static_cast<int>(fb::DType::Float32) == static_cast<int>(DType::kFloat32));
static_assert(static_cast<int>(fb::DType::BFloat16) == static_cast<int>(DType::kBFloat16));

namespace {

template <class Root>
Result<const Root*> VerifyFrame(std::span<const uint8_t> frame) {
  if (frame.size() < kFramePrefixBytes + sizeof(flatbuffers::uoffset_t)) {
    return InvalidArgument("frame too short to hold a FlatBuffer");
  }
  uint32_t len;
  std::memcpy(&len, frame.data(), sizeof(len));
  if (len != frame.size() - kFramePrefixBytes) {
    return InvalidArgument("frame length prefix disagrees with the frame");
  }
  flatbuffers::Verifier verifier(frame.data(), frame.size(), kVerifierMaxDepth, kVerifierMaxTables);
  if (!verifier.VerifySizePrefixedBuffer<Root>(nullptr)) {
    return InvalidArgument("frame failed FlatBuffers verification");
  }
  return flatbuffers::GetSizePrefixedRoot<Root>(frame.data());
}

}  // namespace

Result<const fb::Request*> VerifyRequestFrame(std::span<const uint8_t> frame) {
  KVTIER_ASSIGN_OR_RETURN(const fb::Request* r, VerifyFrame<fb::Request>(frame));
  // The verifier accepts a union type without its table; nothing downstream should have to.
  const bool known = r->op_type() != fb::Op::NONE && static_cast<int>(r->op_type()) <= static_cast<int>(fb::Op::MAX);
  if (known && r->op() == nullptr) {
    return InvalidArgument("malformed frame: operation " + std::string(OpName(r->op_type())) + " has no body");
  }
  return r;
}

Result<const fb::Response*> VerifyResponseFrame(std::span<const uint8_t> frame) {
  KVTIER_ASSIGN_OR_RETURN(const fb::Response* r, VerifyFrame<fb::Response>(frame));
  if (r->reply_type() != fb::Reply::NONE && r->reply() == nullptr) {
    return InvalidArgument("malformed frame: a reply type without its body");
  }
  return r;
}

Status StatusFromResponse(const fb::Response& r) {
  const StatusCode code = FromWire(r.status());
  if (code == StatusCode::kOk) return Status::Ok();
  return Status(code, r.message() ? r.message()->str() : std::string());
}

BlockState BlockStateFromWire(fb::BlockState s) {
  const auto v = static_cast<uint8_t>(s);
  return v <= static_cast<uint8_t>(BlockState::kNeverStored) ? static_cast<BlockState>(v) : BlockState::kNeverStored;
}

ModelLayout LayoutFromWire(const fb::Layout& l) {
  ModelLayout m;
  if (l.model_id()) m.model_id = l.model_id()->str();
  m.num_layers = l.num_layers();
  m.kv_heads = l.kv_heads();
  m.head_dim = l.head_dim();
  const int d = static_cast<int>(l.dtype());
  m.dtype = d <= static_cast<int>(DType::kFloat32) ? static_cast<DType>(d) : DType::kUnknown;
  m.tokens_per_block = l.tokens_per_block();
  m.block_bytes = l.block_bytes();
  return m;
}

flatbuffers::Offset<fb::Layout> LayoutToWire(flatbuffers::FlatBufferBuilder& b, const ModelLayout& l) {
  return fb::CreateLayout(b, b.CreateString(l.model_id), l.num_layers, l.kv_heads, l.head_dim,
                          static_cast<fb::DType>(l.dtype), l.tokens_per_block, l.block_bytes);
}

Result<HashList> HashList::Parse(const flatbuffers::Vector<uint8_t>* v, size_t hash_bytes) {
  HashList h;
  h.hash_bytes_ = hash_bytes;
  if (v == nullptr || v->size() == 0) return h;
  if (hash_bytes == 0 || v->size() % hash_bytes != 0) {
    return InvalidArgument("hash vector of " + std::to_string(v->size()) +
                           " bytes is not a multiple of the session's hash size " + std::to_string(hash_bytes));
  }
  h.data_ = v->data();
  h.count_ = v->size() / hash_bytes;
  return h;
}

flatbuffers::Offset<flatbuffers::Vector<uint8_t>> HashesToWire(flatbuffers::FlatBufferBuilder& b,
                                                               std::span<const BlockHash> hashes) {
  const size_t hb = hashes.empty() ? 0 : hashes[0].size();
  uint8_t* out = nullptr;
  auto off = b.CreateUninitializedVector<uint8_t>(hashes.size() * hb, &out);
  for (size_t i = 0; i < hashes.size(); ++i) CopyHashBytes(out + i * hb, hashes[i].bytes().data(), hb);
  return off;
}

}  // namespace kvtier
