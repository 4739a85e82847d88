#include "data/image.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>
#include <jerror.h>

#include "core/error.h"
#include "core/ops/factory.h"
#include "core/regular_file.h"

namespace kiln::data {

namespace {

std::atomic<int64_t> g_max_image_pixels{kDefaultMaxImagePixels};

}  // namespace

int64_t max_image_pixels() { return g_max_image_pixels.load(std::memory_order_relaxed); }

void set_max_image_pixels(int64_t pixels) {
  KILN_CHECK(pixels >= 1, "set_max_image_pixels: the limit {} must be at least 1", pixels);
  g_max_image_pixels.store(pixels, std::memory_order_relaxed);
}

void check_image_size(int64_t height, int64_t width, std::string_view what) {
  KILN_CHECK(height >= 0 && width >= 0, "{}: bad image size {}x{}", what, height, width);
  const int64_t limit = max_image_pixels();
  int64_t pixels = 0;
  const bool overflow = __builtin_mul_overflow(height, width, &pixels);
  if (overflow || pixels > limit)
    throw ImageTooLarge(fmt::format(
        "{}: a {}x{} image ({} pixels) is larger than the limit of {} pixels (data::set_max_image_pixels)", what,
        height, width, overflow ? "too many" : std::to_string(pixels), limit));
}

Image::Image(int64_t height, int64_t width, int64_t channels)
    : height(height), width(width), channels(channels) {
  KILN_CHECK(height >= 0 && width >= 0 && (channels == 1 || channels == 3),
             "Image: bad size {}x{}x{} (channels must be 1 or 3)", height, width, channels);
  check_image_size(height, width, "Image");
  pixels.assign(static_cast<size_t>(height * width * channels), 0);
}

Tensor to_tensor(const Image& image) {
  KILN_CHECK(static_cast<int64_t>(image.pixels.size()) == image.height * image.width * image.channels,
             "to_tensor: image of {}x{}x{} holds {} bytes", image.height, image.width, image.channels,
             image.pixels.size());
  Tensor t = empty({image.channels, image.height, image.width});
  float* out = t.data_ptr<float>();
  const int64_t plane = image.height * image.width;
  const uint8_t* in = image.pixels.data();
  for (int64_t c = 0; c < image.channels; ++c)
    for (int64_t i = 0; i < plane; ++i) out[c * plane + i] = in[i * image.channels + c] * (1.0f / 255.0f);
  return t;
}

namespace {

// libjpeg reports fatal errors through error_exit, which must not return. We longjmp back
// to the setjmp of the phase that called into libjpeg (rather than throwing through C
// frames, which libjpeg is not compiled to unwind). Every function that calls setjmp keeps
// only trivially destructible locals, so the jump skips no destructor.
struct JpegErrorManager {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jump_on_error(j_common_ptr cinfo) {
  auto* manager = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, manager->message);
  std::longjmp(manager->jump, 1);
}

// libjpeg decodes past corrupt data with a warning (level -1): a truncated file is padded
// with an end marker and shows grey, a bad Huffman code or a missing restart marker garbles
// the rest of the image. A training image in that state is a broken one, so every warning
// is an error, except the two about metadata that leave the pixels intact. Trace messages
// (level >= 0) would go to stderr; we stay quiet instead.
void quiet_or_jump_on_corruption(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  const int code = cinfo->err->msg_code;
  if (code == JWRN_ADOBE_XFORM || code == JWRN_JFIF_MAJOR) return;
  jump_on_error(cinfo);
}

void install_error_manager(JpegErrorManager& manager) {
  jpeg_std_error(&manager.base);
  manager.base.error_exit = jump_on_error;
  manager.base.emit_message = quiet_or_jump_on_corruption;
  manager.message[0] = '\0';
}

// read_jpeg refuses files beyond this size before reading them: far above any JPEG of
// max_image_pixels() that a camera or an encoder writes.
constexpr int64_t kMaxJpegFileBytes = int64_t{1} << 30;

class JpegDecoder {
 public:
  JpegDecoder() {
    install_error_manager(errors_);
    cinfo_.err = &errors_.base;
  }
  ~JpegDecoder() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  const char* message() const { return errors_.message; }
  const jpeg_decompress_struct& info() const { return cinfo_; }

  // Reads the header and picks the output colour space; false on an error (see message()).
  bool read_header(const uint8_t* bytes, size_t size) {
    if (setjmp(errors_.jump)) return false;
    jpeg_create_decompress(&cinfo_);
    created_ = true;
    jpeg_mem_src(&cinfo_, bytes, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo_, TRUE);
    // libjpeg-turbo cannot convert CMYK/YCCK to RGB itself; those come out as CMYK and
    // decode() converts them.
    const J_COLOR_SPACE space = cinfo_.jpeg_color_space;
    cinfo_.out_color_space = space == JCS_GRAYSCALE               ? JCS_GRAYSCALE
                             : space == JCS_CMYK || space == JCS_YCCK ? JCS_CMYK
                                                                    : JCS_RGB;
    jpeg_calc_output_dimensions(&cinfo_);
    return true;
  }

  // Decodes all rows into `out` (output_height * output_width * output_components bytes).
  bool read_pixels(uint8_t* out) {
    if (setjmp(errors_.jump)) return false;
    jpeg_start_decompress(&cinfo_);
    const size_t row_bytes = static_cast<size_t>(cinfo_.output_width) * cinfo_.output_components;
    while (cinfo_.output_scanline < cinfo_.output_height) {
      JSAMPROW row = out + static_cast<size_t>(cinfo_.output_scanline) * row_bytes;
      jpeg_read_scanlines(&cinfo_, &row, 1);
    }
    jpeg_finish_decompress(&cinfo_);
    return true;
  }

 private:
  jpeg_decompress_struct cinfo_{};
  JpegErrorManager errors_{};
  bool created_ = false;
};

// CMYK as Photoshop writes it (the Adobe marker) stores inverted values, so that
// R = C * K / 255; plain CMYK has R = (255 - C)(255 - K) / 255.
void cmyk_to_rgb(const uint8_t* cmyk, int64_t pixel_count, bool inverted, uint8_t* rgb) {
  for (int64_t i = 0; i < pixel_count; ++i, cmyk += 4, rgb += 3) {
    const int k = inverted ? cmyk[3] : 255 - cmyk[3];
    for (int c = 0; c < 3; ++c) {
      const int ink = inverted ? cmyk[c] : 255 - cmyk[c];
      rgb[c] = static_cast<uint8_t>((ink * k + 127) / 255);
    }
  }
}

class JpegEncoder {
 public:
  JpegEncoder() {
    install_error_manager(errors_);
    cinfo_.err = &errors_.base;
  }
  ~JpegEncoder() {
    if (created_) jpeg_destroy_compress(&cinfo_);
    std::free(buffer_);  // jpeg_mem_dest allocates it with malloc
  }
  JpegEncoder(const JpegEncoder&) = delete;
  JpegEncoder& operator=(const JpegEncoder&) = delete;

  const char* message() const { return errors_.message; }
  const uint8_t* data() const { return buffer_; }
  size_t size() const { return static_cast<size_t>(size_); }

  bool encode(const Image& image, int quality) {
    if (setjmp(errors_.jump)) return false;
    jpeg_create_compress(&cinfo_);
    created_ = true;
    jpeg_mem_dest(&cinfo_, &buffer_, &size_);
    cinfo_.image_width = static_cast<JDIMENSION>(image.width);
    cinfo_.image_height = static_cast<JDIMENSION>(image.height);
    cinfo_.input_components = static_cast<int>(image.channels);
    cinfo_.in_color_space = image.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo_);
    jpeg_set_quality(&cinfo_, quality, TRUE);
    jpeg_start_compress(&cinfo_, TRUE);
    const size_t row_bytes = static_cast<size_t>(image.width * image.channels);
    while (cinfo_.next_scanline < cinfo_.image_height) {
      // libjpeg's API takes non-const rows but only reads them.
      JSAMPROW row = const_cast<uint8_t*>(image.pixels.data()) + cinfo_.next_scanline * row_bytes;
      jpeg_write_scanlines(&cinfo_, &row, 1);
    }
    jpeg_finish_compress(&cinfo_);
    return true;
  }

 private:
  jpeg_compress_struct cinfo_{};
  JpegErrorManager errors_{};
  bool created_ = false;
  unsigned char* buffer_ = nullptr;
  unsigned long size_ = 0;
};

std::string errno_message(int error) { return std::generic_category().message(error); }

// A name next to `path` that no other writer (thread or process) uses at the same time.
std::filesystem::path temporary_name_for(const std::filesystem::path& path) {
  static std::atomic<uint64_t> counter{0};
  std::filesystem::path temporary = path;
  temporary += fmt::format(".tmp-{}-{}", static_cast<long>(::getpid()), counter.fetch_add(1));
  return temporary;
}

}  // namespace

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name) {
  KILN_CHECK(!bytes.empty(), "decode_jpeg: {}: no data (an empty file is not a JPEG)", name);
  JpegDecoder decoder;
  if (!decoder.read_header(bytes.data(), bytes.size()))
    fail("decode_jpeg: {}: not a valid JPEG ({} bytes): {}", name, bytes.size(), decoder.message());
  const jpeg_decompress_struct& info = decoder.info();
  const int64_t height = info.output_height, width = info.output_width;
  const int64_t components = info.output_components;
  // Before jpeg_start_decompress, which allocates whole-image buffers for progressive files.
  check_image_size(height, width, fmt::format("decode_jpeg: {}", name));
  if (components == 4) {
    std::vector<uint8_t> cmyk(static_cast<size_t>(height * width * 4));
    if (!decoder.read_pixels(cmyk.data()))
      fail("decode_jpeg: {}: corrupt JPEG ({}x{} CMYK, {} bytes): {}", name, height, width, bytes.size(),
           decoder.message());
    Image image(height, width, 3);
    cmyk_to_rgb(cmyk.data(), height * width, info.saw_Adobe_marker, image.pixels.data());
    return image;
  }
  KILN_CHECK(components == 1 || components == 3, "decode_jpeg: {}: unsupported JPEG with {} channels", name,
             components);
  Image image(height, width, components);
  if (!decoder.read_pixels(image.pixels.data()))
    fail("decode_jpeg: {}: corrupt JPEG ({}x{}x{}, {} bytes): {}", name, height, width, components, bytes.size(),
         decoder.message());
  return image;
}

Image read_jpeg(const std::filesystem::path& path) {
  const std::string bytes = read_regular_file(path, "read_jpeg", kMaxJpegFileBytes);
  return decode_jpeg(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), path.string());
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  KILN_CHECK(image.channels == 1 || image.channels == 3, "encode_jpeg: {} channels (must be 1 or 3)",
             image.channels);
  KILN_CHECK(image.height > 0 && image.width > 0 && image.height <= JPEG_MAX_DIMENSION &&
                 image.width <= JPEG_MAX_DIMENSION,
             "encode_jpeg: a {}x{} image cannot be a JPEG (each side 1..{})", image.height, image.width,
             JPEG_MAX_DIMENSION);
  KILN_CHECK(static_cast<int64_t>(image.pixels.size()) == image.height * image.width * image.channels,
             "encode_jpeg: image of {}x{}x{} holds {} bytes", image.height, image.width, image.channels,
             image.pixels.size());
  KILN_CHECK(quality >= 1 && quality <= 100, "encode_jpeg: quality {} outside 1..100", quality);
  JpegEncoder encoder;
  if (!encoder.encode(image, quality))
    fail("encode_jpeg: {}x{}x{} image: {}", image.height, image.width, image.channels, encoder.message());
  return std::vector<uint8_t>(encoder.data(), encoder.data() + encoder.size());
}

void write_jpeg(const std::filesystem::path& path, const Image& image, int quality) {
  const std::vector<uint8_t> bytes = encode_jpeg(image, quality);
  const std::filesystem::path temporary = temporary_name_for(path);
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) fail("write_jpeg: cannot create {}: {}", temporary.string(), errno_message(errno));
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  const int write_error = errno;
  const bool closed = std::fclose(file) == 0;
  const int close_error = errno;
  if (!written || !closed) {
    std::remove(temporary.c_str());
    fail("write_jpeg: cannot write {}: {}", temporary.string(), errno_message(written ? close_error : write_error));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::remove(temporary.c_str());
    fail("write_jpeg: cannot rename {} to {}: {}", temporary.string(), path.string(), error.message());
  }
}

}  // namespace kiln::data
