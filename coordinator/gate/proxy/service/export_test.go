package service

// What the tests of the object layer read directly.
var (
	ErrRepeated          = errRepeated
	JSONServiceForWrite  = jsonServiceForWrite
	ProtoServiceForWrite = protoServiceForWrite
)

// ScanJSON reads a JSON Service object with its names and versions.
func ScanJSON(b []byte) (*Service, error) {
	sc := jsonServiceScanner{meta: true}
	return sc.scan(b)
}

// ScanProto reads a protobuf Service message with its names and versions.
func ScanProto(msg []byte) (*Service, error) {
	sc := protoServiceScanner{meta: true}
	return sc.scan(msg)
}
