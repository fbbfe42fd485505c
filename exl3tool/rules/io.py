"""Rules of the io layer: safetensors structure (ST), JSON documents (JS), paths (PA)."""

from exl3tool.rules.registry import Severity, rule

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

ST_SHORT = rule(
    "ST001",
    "file-too-short",
    E,
    "File shorter than the 8-byte header length",
    "A safetensors file starts with an 8-byte little-endian header length.",
    "Re-download or re-export the file; it is truncated.",
)
ST_HEADER_LEN = rule(
    "ST002",
    "header-length",
    E,
    "Header length out of range",
    "The header length must be 1..100,000,000 and fit in the file; readers size buffers from it.",
    "The file is truncated or not a safetensors file (all-zero prefix = broken download).",
)
ST_ENCODING = rule(
    "ST003",
    "header-encoding",
    E,
    "Header is not UTF-8 without BOM",
    "The header must be UTF-8 JSON; a BOM or invalid bytes are rejected by the reference reader.",
    "Rewrite the header as plain UTF-8 JSON.",
)
ST_JSON = rule(
    "ST004",
    "header-json",
    E,
    "Header is not valid JSON",
    "The header must parse as one JSON object.",
    "Re-export the file with a safetensors writer.",
)
ST_NOT_OBJECT = rule(
    "ST005",
    "header-not-object",
    E,
    "Header is not a JSON object",
    "The header must be an object mapping tensor names to entries.",
    "Re-export the file with a safetensors writer.",
)
ST_DUPLICATE = rule(
    "ST006",
    "duplicate-tensor",
    E,
    "Duplicate key in the header",
    "Rust keeps one duplicate, Python json keeps the last: the same file loads differently.",
    "Write each tensor name once.",
)
ST_METADATA = rule(
    "ST007",
    "metadata-type",
    E,
    "__metadata__ is not a string-to-string map",
    "Every reader rejects non-string metadata values.",
    "Store metadata values as strings.",
)
ST_ENTRY = rule(
    "ST008",
    "entry-shape",
    E,
    "Tensor entry is malformed",
    "Each entry must be an object with dtype, shape and data_offsets.",
    "Re-export the file with a safetensors writer.",
)
ST_EXTRA_FIELD = rule(
    "ST009",
    "entry-extra-field",
    W,
    "Tensor entry has unknown fields",
    "The JSON schema forbids extra fields; the Rust reader silently ignores them.",
    "Drop the extra fields from the entry.",
)
ST_DTYPE = rule(
    "ST010",
    "unknown-dtype",
    E,
    "Unknown dtype",
    "Readers cannot size or interpret a tensor of an unknown dtype.",
    "Use a safetensors dtype (I16, F16, I32, F32, BF16, ...).",
)
ST_SHAPE = rule(
    "ST011",
    "bad-shape",
    E,
    "Shape is not a list of non-negative integers",
    "Shapes must be JSON integers (no bools, floats or negatives) below 2^48.",
    "Write the shape as a list of non-negative integers.",
)
ST_OFFSETS = rule(
    "ST012",
    "bad-offsets",
    E,
    "data_offsets is not [begin, end] with begin <= end",
    "Offsets must be two JSON integers, 0 <= begin <= end < 2^48.",
    "Re-export the file with a safetensors writer.",
)
ST_SIZE = rule(
    "ST013",
    "size-mismatch",
    E,
    "Byte length does not match dtype x shape",
    "end - begin must equal prod(shape) * itemsize; otherwise the tensor reads garbage.",
    "Re-export the tensor; its header and payload disagree.",
)
ST_GAP = rule(
    "ST014",
    "offset-gap",
    E,
    "Gap between tensor payloads",
    "Payloads must be contiguous from offset 0 (anti-polyglot rule of the reference reader).",
    "Re-export the file so payloads are packed back to back.",
)
ST_OVERLAP = rule(
    "ST015",
    "offset-overlap",
    E,
    "Tensor payloads overlap",
    "Overlapping tensors alias each other's bytes (a known DoS and confusion vector).",
    "Re-export the file so each tensor owns its bytes.",
)
ST_COVERAGE = rule(
    "ST016",
    "data-coverage",
    E,
    "Data section does not end exactly at end of file",
    "Trailing bytes or payloads past EOF mean truncation or a polyglot file.",
    "Re-download the file, or re-export it without trailing data.",
)
ST_NAME = rule(
    "ST017",
    "unsafe-tensor-name",
    E,
    "Unsafe tensor name",
    "Names with control characters, NUL, path separators or '..' break tools that use names as paths.",
    "Rename the tensor to [A-Za-z0-9_.-] characters.",
)
ST_PADDING = rule(
    "ST018",
    "header-padding",
    E,
    "Header padding is not spaces",
    "Only 0x20 may follow the JSON object; NUL padding is rejected by strict readers.",
    "Pad the header with spaces.",
)
ST_LEADING_WS = rule(
    "ST019",
    "header-leading-space",
    W,
    "Header starts with whitespace",
    "The spec says the header MUST begin with '{'; only newer readers accept leading whitespace.",
    "Start the header with '{' and pad at the end instead.",
)
ST_ALIGN = rule(
    "ST020",
    "header-alignment",
    INFO,
    "Data section is not 8-byte aligned",
    "Writers pad the header to a multiple of 8 so tensors can be mapped aligned.",
    "Pad the header with spaces to a multiple of 8 bytes.",
)
ST_NONFINITE = rule(
    "ST021",
    "header-nonfinite",
    E,
    "NaN or Infinity in the header",
    "NaN/Infinity are not JSON; parsers disagree on them.",
    "Remove the constant.",
)
ST_EMPTY = rule(
    "ST022",
    "empty-file",
    W,
    "File holds no tensors",
    "An empty shard is legal but almost always a packaging mistake.",
    "Remove the file or fill it.",
)
ST_CHANGED = rule(
    "ST023",
    "file-changed",
    E,
    "File changed while it was read",
    "Its size, inode or mtime changed between the start and the end of the read.",
    "Re-run once nothing writes to the file.",
)
ST_DEPTH = rule(
    "ST024",
    "header-depth",
    E,
    "Header nests too deeply",
    "Deep nesting exhausts parsers' stacks; no valid header nests beyond 3 levels.",
    "Re-export the file with a safetensors writer.",
)

JS_SYNTAX = rule(
    "JS001",
    "json-syntax",
    E,
    "Not valid JSON",
    "The document does not parse as JSON.",
    "Fix the JSON syntax (a validator shows the spot).",
)
JS_DUPLICATE = rule(
    "JS002",
    "json-duplicate-key",
    E,
    "Duplicate key in a JSON object",
    "Python keeps the last duplicate, other parsers the first: readers disagree.",
    "Keep one of the duplicate keys.",
)
JS_NONFINITE = rule(
    "JS003",
    "json-nonfinite",
    E,
    "NaN, Infinity or overflowing number",
    "NaN/Infinity are not JSON and 1e999 overflows to infinity.",
    "Write a finite number.",
)
JS_HUGE_INT = rule(
    "JS004",
    "json-huge-int",
    E,
    "Integer out of range",
    "Integers beyond 2^63 overflow 64-bit readers.",
    "Write an integer within 64 bits.",
)
JS_ENCODING = rule(
    "JS005",
    "json-encoding",
    E,
    "JSON file is not UTF-8",
    "JSON files must be UTF-8 (RFC 8259).",
    "Re-save the file as UTF-8 without BOM.",
)
JS_TOO_LARGE = rule(
    "JS006",
    "json-too-large",
    E,
    "JSON file too large",
    "Config and manifest files are small; a huge one is a mistake or an attack.",
    "Check that the right file is in place.",
)
JS_DEPTH = rule(
    "JS007",
    "json-depth",
    E,
    "JSON nests too deeply",
    "Deep nesting exhausts parsers' stacks.",
    "Flatten the document.",
)
JS_NOT_OBJECT = rule(
    "JS008",
    "json-not-object",
    E,
    "JSON document is not an object",
    "Configs and manifests are JSON objects.",
    "Wrap the content in an object.",
)
JS_UNREADABLE = rule(
    "JS009",
    "json-unreadable",
    E,
    "JSON document cannot be read",
    "The file is there but reading it failed (an I/O error, a permission, a file that is not "
    "one): the runtime cannot read it either.",
    "Replace the file with a readable copy.",
)

PA_MISSING = rule(
    "PA001",
    "path-missing",
    E,
    "Referenced file is missing",
    "A file named by a manifest or index does not exist.",
    "Add the file or fix the reference.",
)
PA_SYMLINK = rule(
    "PA002",
    "path-symlink",
    E,
    "Symlink where a regular file is required",
    "The runtime opens adapter files without following links (a link can point anywhere and "
    "change under the reader); links into the artifact or the Hugging Face cache's blobs/ are "
    "read like files, others are refused.",
    "Run `exl3tool stage-cartridge`: it writes a real-file copy; or replace the link with the file.",
)
PA_NOT_REGULAR = rule(
    "PA003",
    "path-not-regular",
    E,
    "Not a regular file",
    "FIFOs, devices and directories cannot stand in for a payload file.",
    "Replace it with a regular file.",
)
PA_ESCAPE = rule(
    "PA004",
    "path-escape",
    E,
    "Path escapes the artifact directory",
    "Absolute paths, '..' segments or links leaving the directory are rejected.",
    "Use a relative path inside the artifact directory.",
)
PA_LINK_ESCAPE = rule(
    "PA006",
    "path-symlink-escape",
    W,
    "Symlink leaves the artifact",
    "The runtime follows it, so the checkpoint depends on a file outside its directory (and "
    "outside the Hugging Face cache's blobs/) that copies and uploads lose and others can change.",
    "Replace the link with the file (cp -L), or point it inside the artifact.",
)
PA_DUPLICATE = rule(
    "PA005",
    "path-duplicate",
    E,
    "The same file is listed twice",
    "Each shard must be listed once.",
    "Remove the duplicate entry.",
)
