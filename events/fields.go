package events

// Fields is one object of a body decoded strictly (the wire decoders of
// package protocol are built on it): its keys, and its path in the body,
// which every refusal's text names. Each accessor returns a *Refusal with
// its protocol Code when the value is missing, of the wrong type, or not
// valid.
type Fields struct {
	m    map[string]any
	path string
}

// DecodeObject decodes a whole body, msgpack or JSON when isJSON, as an
// object; path names it in refusals ("submit", "resume").
func DecodeObject(body []byte, isJSON bool, path string) (Fields, error) {
	v, err := decodeGeneric(body, isJSON)
	if err != nil {
		return Fields{}, err
	}
	return objectFields(v, path)
}

func objectFields(v any, path string) (Fields, error) {
	m, err := object(v, path)
	if err != nil {
		return Fields{}, err
	}
	return Fields{m: m, path: path}, nil
}

// Path returns where the object is in the body.
func (f Fields) Path() string { return f.path }

// Has reports whether the object has the key.
func (f Fields) Has(key string) bool {
	_, ok := f.m[key]
	return ok
}

// Only refuses a key outside allowed.
func (f Fields) Only(allowed ...string) error { return only(f.m, f.path, allowed...) }

// String returns a string field ("" when absent and not required).
func (f Fields) String(key string, required bool) (string, error) {
	return str(f.m, key, f.path, required)
}

// Bool returns a boolean field (false when absent).
func (f Fields) Bool(key string) (bool, error) { return boolean(f.m, key, f.path) }

// Int returns an integer field (0 when absent and not required).
func (f Fields) Int(key string, required bool) (int64, error) {
	return integer(f.m, key, f.path, required)
}

// Object returns a nested object.
func (f Fields) Object(key string) (Fields, error) { return objectFields(f.m[key], f.path+"."+key) }

// Blocks returns a list of content blocks.
func (f Fields) Blocks(key string) ([]ContentBlock, error) {
	return parseBlocks(f.m[key], f.path+"."+key)
}

// ResumeResult returns a resume's result.
func (f Fields) ResumeResult(key string) (ResumeResult, error) {
	return parseResumeResult(f.m[key], f.path+"."+key)
}

// Undecodablef returns the refusal of a body that does not decode as its
// message.
func Undecodablef(format string, args ...any) *Refusal { return undecodablef(format, args...) }
