// The library's side door into the public codec handles: the encoder and decoders
// (CPU and CUDA) read a Profile's tables and use a DecodeScratch's buffers through
// these, so the public headers carry no impl() accessor. Not part of the public API.
#pragma once

#include "kvstream/codec.hpp"

namespace kvstream::codec {

struct ProfileAccess {
  static const Profile::Impl& of(const Profile& p) noexcept { return *p.impl_; }
};

struct ScratchAccess {
  static DecodeScratch::Impl& of(DecodeScratch& s) noexcept { return *s.impl_; }
};

}  // namespace kvstream::codec
