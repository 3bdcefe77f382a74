package config

const (
	// MaxConfigBytes bounds .jailbee/config.yaml before it is parsed; the
	// file is written by hand and a real one is a few KiB.
	MaxConfigBytes = 256 << 10

	// DefaultIdleAfterSeconds is orchestration.idle_after_seconds when the
	// key is absent (spec: "defaults to 900 positive seconds").
	DefaultIdleAfterSeconds = 900

	// MaxIdleAfterSeconds bounds idle_after_seconds to a week; more is a typo.
	MaxIdleAfterSeconds = 7 * 24 * 3600

	// MaxServices bounds a service list (spec: services "up to 32 names").
	MaxServices = 32

	// MaxWarmPaths bounds a warm_paths list.
	MaxWarmPaths = 64

	// MaxWarmPathLen bounds one warm_paths glob.
	MaxWarmPathLen = 256

	// maxShownLen bounds how much of a configured value a message repeats.
	maxShownLen = 60

	// maxShownPathLen bounds the key path of an error message.
	maxShownPathLen = 4 * maxShownLen
)
